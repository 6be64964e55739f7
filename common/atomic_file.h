#pragma once

// The one way rlmesh replaces a file: readers see either the old contents or
// the new, never a prefix, and after OK the new contents survive a crash.
//
//   1. write `<path>.tmp.<pid>` in the same directory (so rename(2) is atomic),
//   2. fsync the file,
//   3. rename it over `path`,
//   4. fsync the directory (so the rename itself is durable).
//
// On any error the temp file is removed and `path` keeps its old contents;
// the status names the path and the failing step, with the errno's code
// (PERMISSION_DENIED, NOT_FOUND, RESOURCE_EXHAUSTED...).
//
// The pid in the temp name lets two processes write the same path without
// sharing a temp file (the last rename wins). Two threads of one process
// must not write the same path at once.

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rlmesh {

struct AtomicFileOptions {
  // Permission bits of the new file, before the umask. Default: 0644.
  mode_t mode = 0644;
};

// Replaces `path` with `contents` (steps 1-4 above).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 const AtomicFileOptions& options = {});

// The same protocol for contents written in pieces (a multi-gigabyte
// safetensors file need not be held in memory):
//
//   AtomicFileWriter w(path);
//   RLMESH_RETURN_IF_ERROR(w.Open());
//   RLMESH_RETURN_IF_ERROR(w.Append(header));
//   RLMESH_RETURN_IF_ERROR(w.Append(data, n));
//   RLMESH_RETURN_IF_ERROR(w.Commit());
//
// Destroying a writer that was not committed removes its temp file and
// leaves `path` as it was. Not thread-safe: one thread uses a writer.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path, AtomicFileOptions options = {});
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Creates the temp file. REQUIRES: called once, before Append.
  absl::Status Open();
  // REQUIRES: Open() returned OK and Commit() was not called.
  absl::Status Append(const void* data, size_t n);
  absl::Status Append(absl::string_view bytes) { return Append(bytes.data(), bytes.size()); }
  // fsync, rename over the path, fsync the directory. After an error the
  // temp file is gone and the writer is finished.
  absl::Status Commit();

  const std::string& path() const { return path_; }

 private:
  void Discard();

  const std::string path_;
  const AtomicFileOptions options_;
  std::string tmp_;
  int fd_ = -1;
};

// fsyncs a directory, so that entries created, renamed or removed in it
// survive a crash. "" means the current directory.
absl::Status FsyncDirectory(const std::string& dir);

}  // namespace rlmesh
