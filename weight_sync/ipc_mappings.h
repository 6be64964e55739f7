#pragma once

// The publisher's device memory a CUDA_IPC receiver has mapped. CUDA shares
// memory by cudaMalloc'd segment: a handle names a whole segment of the
// publisher's caching allocator, several buckets may lie in one, and a
// process may map a handle only once. IpcMappings opens each (publisher,
// handle) once, gives every bucket its segment's base, and closes a segment
// once no bucket of the versions kept needs it. The CUDA calls are passed
// in, so the bookkeeping is tested without a GPU.
//
// Thread-compatible: one receiver, one thread.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace rlmesh::weight_sync::internal {

class IpcMappings {
 public:
  // A publisher's segment: its pid and the segment's handle.
  using Key = std::pair<int64_t, std::string>;
  // cudaIpcOpenMemHandle: the segment's base in this process.
  using OpenFn = std::function<absl::StatusOr<void*>(const cudaIpcMemHandle_t&)>;
  // cudaIpcCloseMemHandle.
  using CloseFn = std::function<void(void*)>;

  IpcMappings(OpenFn open, CloseFn close) : open_(std::move(open)), close_(std::move(close)) {}
  IpcMappings(const IpcMappings&) = delete;
  IpcMappings& operator=(const IpcMappings&) = delete;
  ~IpcMappings() { CloseAll(); }

  static Key KeyOf(int64_t pid, const cudaIpcMemHandle_t& handle);

  // The base of the segment `handle` names, mapped on first use; open_'s
  // error otherwise (nothing is kept then).
  absl::StatusOr<void*> Open(int64_t pid, const cudaIpcMemHandle_t& handle);

  // Closes every mapped segment not in `keep`.
  void Retain(const std::set<Key>& keep);

  void CloseAll() { Retain({}); }

  int64_t size() const { return static_cast<int64_t>(mapped_.size()); }

 private:
  const OpenFn open_;
  const CloseFn close_;
  std::map<Key, void*> mapped_;
};

}  // namespace rlmesh::weight_sync::internal
