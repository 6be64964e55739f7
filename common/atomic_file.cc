#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace rlmesh {
namespace {

absl::Status ErrnoError(int err, absl::string_view op, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(op, " ", path));
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::Status FsyncDirectory(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open directory", d);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError(err, "fsync directory", d);
  return absl::OkStatus();
}

AtomicFileWriter::AtomicFileWriter(std::string path, AtomicFileOptions options)
    : path_(std::move(path)), options_(options) {}

AtomicFileWriter::~AtomicFileWriter() { Discard(); }

void AtomicFileWriter::Discard() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
}

absl::Status AtomicFileWriter::Open() {
  tmp_ = absl::StrCat(path_, ".tmp.", ::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, options_.mode);
  if (fd_ < 0) return ErrnoError(errno, "create", tmp_);
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Append(const void* data, size_t n) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is not open"));
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      const absl::Status s = ErrnoError(errno, "write", tmp_);
      Discard();
      return s;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is not open"));
  if (::fsync(fd_) != 0) {
    const absl::Status s = ErrnoError(errno, "fsync", tmp_);
    Discard();
    return s;
  }
  // close(2) can report a deferred write error (NFS); treat it as one.
  const int rc = ::close(fd_);
  const int close_errno = errno;
  fd_ = -1;
  if (rc != 0) {
    ::unlink(tmp_.c_str());
    return ErrnoError(close_errno, "close", tmp_);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const absl::Status s = ErrnoError(errno, absl::StrCat("rename ", tmp_, " ->"), path_);
    ::unlink(tmp_.c_str());
    return s;
  }
  // The new contents are in place; this makes the rename durable.
  return FsyncDirectory(DirectoryOf(path_));
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 const AtomicFileOptions& options) {
  AtomicFileWriter w(path, options);
  RLMESH_RETURN_IF_ERROR(w.Open());
  RLMESH_RETURN_IF_ERROR(w.Append(contents));
  return w.Commit();
}

}  // namespace rlmesh
