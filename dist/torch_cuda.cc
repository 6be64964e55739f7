#include "dist/torch_cuda.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "dist/cuda_shim.h"

namespace rlmesh::dist {

absl::StatusOr<cudaStream_t> TorchCurrentStream(int device) {
  RLMESH_ASSIGN_OR_RETURN(void* f, TorchCudaShimSymbol("rlmesh_cuda_current_stream"));
  auto current = reinterpret_cast<int (*)(int, void**, char*, size_t)>(f);
  void* stream = nullptr;
  char error[512] = {0};
  if (current(device, &stream, error, sizeof(error)) != 0) {
    return absl::InternalError(absl::StrCat("LibTorch's current stream on cuda:", device, ": ", error));
  }
  return static_cast<cudaStream_t>(stream);
}

absl::StatusOr<AllocatorSegment> CachingAllocatorSegment(void* ptr) {
  RLMESH_ASSIGN_OR_RETURN(void* f, TorchCudaShimSymbol("rlmesh_cuda_base_allocation"));
  auto base_of = reinterpret_cast<int (*)(void*, void**, size_t*, char*, size_t)>(f);
  AllocatorSegment segment;
  char error[512] = {0};
  if (base_of(ptr, &segment.base, &segment.size, error, sizeof(error)) != 0) {
    return absl::InternalError(absl::StrCat("the CUDA caching allocator's segment of address ",
                                                absl::Hex(reinterpret_cast<uintptr_t>(ptr)), ": ", error));
  }
  return segment;
}

}  // namespace rlmesh::dist
