#pragma once
// LibTorch's c10d::ProcessGroupNCCL for processes on GPUs: the same
// c10d::Backend interface as the Gloo groups (dist/gloo.h), over CUDA
// tensors, from libtorch_cuda_shim.so (dist/cuda_shim.h).
//
// Thread-safety: safe for concurrent use.

#include <cstdint>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"

namespace rlmesh::dist {

// Rank `rank` of a `size`-rank ProcessGroupNCCL rendezvousing through
// `store`. Collectives take tensors on the rank's GPU (the communicator is
// made for the device of the first tensors given; two ranks may not share
// a GPU). Work::wait blocks and throws once `timeout_ms` passes, as a Gloo
// group's does (TORCH_NCCL_BLOCKING_WAIT=1 unless set). FAILED_PRECONDITION
// naming what is missing: LibTorch's CUDA backend, the shared object, or a
// GPU (ProcessGroupNCCL's own "no GPUs found").
absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateNcclGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                                 int rank, int size, int64_t timeout_ms);

}  // namespace rlmesh::dist
