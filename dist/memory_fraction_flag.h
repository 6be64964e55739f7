#pragma once

// --cuda_memory_fraction, the flag every role that may compute on a GPU
// takes (learner, rollout_worker, reward_server): it caps the process's CUDA
// caching allocator at that fraction of its GPU's memory, so that processes
// colocated on one GPU (a learner and a rollout worker) each keep their
// share. The coordinator sets it from learner/rollout.cuda_memory_fraction
// (`coordinator run`) or gpus.*_memory_fraction (`launch`).

#include "absl/flags/declare.h"
#include "absl/status/status.h"

ABSL_DECLARE_FLAG(double, cuda_memory_fraction);

namespace rlmesh::dist {

// Applies --cuda_memory_fraction (0 = no cap: nothing to do) through
// SetCudaMemoryFraction. Call it before anything loads the CUDA backend.
// INVALID_ARGUMENT naming the flag when it is outside (0, 1].
absl::Status ApplyCudaMemoryFractionFlag();

}  // namespace rlmesh::dist
