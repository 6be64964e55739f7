#include "dist/memory_fraction_flag.h"

#include <cstdlib>

#include "absl/flags/flag.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "dist/device.h"

ABSL_FLAG(double, cuda_memory_fraction, 0,
          "Fraction of its GPU's memory this process's CUDA allocator may hold, in (0, 1]; 0 = no cap.");

namespace rlmesh::dist {

absl::Status ApplyCudaMemoryFractionFlag() {
  const double f = absl::GetFlag(FLAGS_cuda_memory_fraction);
  if (f == 0) return absl::OkStatus();
  RLMESH_RETURN_IF_ERROR(SetCudaMemoryFraction(f, "--cuda_memory_fraction"));
  RLMESH_LOG(INFO) << "CUDA allocator capped: PYTORCH_ALLOC_CONF=" << std::getenv("PYTORCH_ALLOC_CONF");
  return absl::OkStatus();
}

}  // namespace rlmesh::dist
