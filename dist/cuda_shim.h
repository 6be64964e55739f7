#pragma once
// libtorch_cuda_shim.so (dist/torch_cuda_shim.cc): the LibTorch objects that
// live in libtorch_cuda (ProcessGroupNCCL, CUDAGraph) behind C entry points.
// The binaries link only LibTorch's CPU libraries; the shim is opened with
// dlopen, after LibTorch's CUDA backend, the first time an entry point is
// asked for.
//
// Where it is looked for: $RLMESH_TORCH_CUDA_SHIM; beside the executable;
// in its runfiles (<exe>.runfiles/rlmesh/dist/ or $RUNFILES_DIR/rlmesh/dist/);
// dist/ under the working directory.
//
// Thread-safety: safe for concurrent use; the library is opened once.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rlmesh::dist {

// Places libtorch_cuda_shim.so is looked for, in order (see above).
std::vector<std::string> TorchCudaShimCandidates();

// The address of the shim's entry point `symbol`. FAILED_PRECONDITION naming
// what is missing: LibTorch's CUDA backend, the shared object (with each
// place tried), or the symbol.
absl::StatusOr<void*> TorchCudaShimSymbol(const char* symbol);

}  // namespace rlmesh::dist
