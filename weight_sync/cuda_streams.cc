#include "dist/torch_cuda.h"
#include "weight_sync/internal.h"

namespace rlmesh::weight_sync::internal {

absl::Status StreamAfterTorch(const CudaRuntimeApi& cuda, int device, cudaStream_t stream, const std::string& what) {
  absl::StatusOr<cudaStream_t> torch = dist::TorchCurrentStream(device);
  if (!torch.ok()) return absl::FailedPreconditionError(absl::StrCat(what, ": ", torch.status().message()));
  return StreamAfter(cuda, stream, *torch, what);
}

}  // namespace rlmesh::weight_sync::internal
