#pragma once

// Where the SHM and CUDA_IPC backends keep their host-side files, for the
// processes that must clean them up without linking a backend (the
// coordinator: a killed publisher leaves its segments behind). No LibTorch.

#include <string>

namespace rlmesh::weight_sync {

// Directory of the segments of a WeightSyncSpec.shm_prefix that holds no '/'.
inline constexpr char kShmDir[] = "/dev/shm/";

// Removes every file in kShmDir whose name starts with `prefix` (a bare
// name, as passed in WeightSyncSpec.shm_prefix). An empty prefix or one
// with a '/' removes nothing. Errors are ignored: this is cleanup.
void RemoveSegments(const std::string& prefix);

}  // namespace rlmesh::weight_sync
