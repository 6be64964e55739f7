#pragma once

// The host-side files of the SHM and CUDA_IPC backends under
// spec.shm_prefix: paths, a shared mapping of the seqlock words, and the
// manifest writes. See shm.cc for the protocol.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "proto/common.pb.h"
#include "weight_sync/segments.h"

namespace rlmesh::weight_sync::internal {

inline std::string ShmPrefix(const WeightSyncSpec& spec) {
  if (spec.shm_prefix().empty()) {
    return absl::StrCat(kShmDir, "rlmesh-", spec.group_name().empty() ? "weights" : spec.group_name(), "-");
  }
  if (!absl::StrContains(spec.shm_prefix(), "/")) return absl::StrCat(kShmDir, spec.shm_prefix());
  return spec.shm_prefix();
}

inline int SlotOf(int64_t version) { return static_cast<int>(version % 2); }
inline std::string BucketPath(const std::string& prefix, int slot, int bucket) {
  return absl::StrCat(prefix, "slot", slot, ".bucket", bucket);
}
inline std::string ManifestPath(const std::string& prefix, int64_t version) {
  return absl::StrCat(prefix, "v", version, ".layout");
}
inline std::string SeqPath(const std::string& prefix) { return absl::StrCat(prefix, "seq"); }

inline absl::Status ErrnoError(const std::string& what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == ENOSPC || e == ENOMEM) return absl::ResourceExhaustedError(msg);
  return absl::UnavailableError(msg);
}

// A shared mapping of a file, unmapped and closed on destruction.
class Mapping {
 public:
  ~Mapping() { Reset(); }
  void Reset() {
    if (addr_ != nullptr && addr_ != MAP_FAILED) munmap(addr_, size_);
    if (fd_ >= 0) close(fd_);
    addr_ = nullptr;
    fd_ = -1;
    size_ = 0;
  }
  // Opens or creates `path`, sizes it to `size` bytes (keeping the pages it
  // has) and maps it read-write.
  absl::Status Create(const std::string& path, int64_t size) {
    Reset();
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) return ErrnoError("open", path);
    if (ftruncate(fd_, size) != 0) return ErrnoError("ftruncate", path);
    return Map(path, size, PROT_READ | PROT_WRITE);
  }
  // Maps an existing file read-only; its size must be `size`.
  absl::Status Open(const std::string& path, int64_t size) {
    Reset();
    fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return ErrnoError("open", path);
    struct stat st;
    if (fstat(fd_, &st) != 0) return ErrnoError("stat", path);
    if (st.st_size != size) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket_bytes: ", path, " holds ", st.st_size, " bytes, the layout says ", size));
    }
    return Map(path, size, PROT_READ);
  }
  void* data() const { return addr_; }
  int64_t size() const { return static_cast<int64_t>(size_); }
  // Whether `path` is still the file this maps (same inode, same size).
  bool Same(const std::string& path) const {
    struct stat a, b;
    return fd_ >= 0 && fstat(fd_, &a) == 0 && stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino &&
           a.st_dev == b.st_dev && a.st_size == b.st_size && b.st_size == static_cast<off_t>(size_);
  }

 private:
  absl::Status Map(const std::string& path, int64_t size, int prot) {
    size_ = static_cast<size_t>(size);
    if (size == 0) return absl::OkStatus();
    // MAP_POPULATE: one call maps every page instead of a fault per 4 KiB
    // page during the copy.
    addr_ = mmap(nullptr, size_, prot, MAP_SHARED | MAP_POPULATE, fd_, 0);
    if (addr_ == MAP_FAILED) {
      addr_ = nullptr;
      return ErrnoError("mmap", path);
    }
    return absl::OkStatus();
  }
  int fd_ = -1;
  void* addr_ = nullptr;
  size_t size_ = 0;
};

inline int64_t LoadSeq(const Mapping& seq, int slot) {
  return __atomic_load_n(static_cast<int64_t*>(seq.data()) + slot, __ATOMIC_ACQUIRE);
}
inline void StoreSeq(const Mapping& seq, int slot, int64_t value) {
  __atomic_store_n(static_cast<int64_t*>(seq.data()) + slot, value, __ATOMIC_RELEASE);
}

// SHM progress words follow the two seq words: (version << 24) | tensors
// written. Layouts hold fewer than 2^24 tensors (checked on publish).
constexpr int kShmSeqWords = 4;
constexpr int kProgressShift = 24;
inline int64_t LoadProgress(const Mapping& seq, int slot) { return LoadSeq(seq, 2 + slot); }
inline void StoreProgress(const Mapping& seq, int slot, int64_t version, int64_t tensors) {
  StoreSeq(seq, 2 + slot, (version << kProgressShift) | tensors);
}

// A version's manifest, written as every rlmesh file is replaced
// (common/atomic_file.h: its temp name starts with the prefix, so
// RemoveSegments cleans up after a killed writer), owner-only like the
// segments. Under /dev/shm (tmpfs) the fsyncs cost nothing.
inline absl::Status WriteManifest(const std::string& path, const std::string& bytes) {
  AtomicFileOptions options;
  options.mode = 0600;
  return WriteFileAtomically(path, bytes, options);
}

inline absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path);
  std::string out;
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  if (n < 0) return ErrnoError("read", path);
  return out;
}

}  // namespace rlmesh::weight_sync::internal
