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
// a GPU). FAILED_PRECONDITION naming what is missing: LibTorch's CUDA
// backend, the shared object, or a GPU (ProcessGroupNCCL's own "no GPUs
// found").
//
// Timeouts differ from a Gloo group's. Work::wait makes the current CUDA
// stream wait for the collective and returns without blocking the host;
// whatever reads the result on the host (a copy to the CPU, item()) waits
// for it. A collective still unfinished `timeout_ms` after it was queued (a
// peer gone or stuck) is caught by ProcessGroupNCCL's watchdog thread, which
// logs "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=...,
// OpType=..., Timeout(ms)=...)" and ends the process with SIGABRT (PyTorch's
// default TORCH_NCCL_ASYNC_ERROR_HANDLING=3, which skips ncclCommAbort since
// that can hang too). So a timeout never comes back as a Status: the
// coordinator restarts the role like any that dies, and the step is retried
// from the newest checkpoint (docs/reliability.md). What NCCL refuses at once
// (a host tensor) still throws, which dist::Collective makes ABORTED.
// TORCH_NCCL_BLOCKING_WAIT and TORCH_NCCL_ASYNC_ERROR_HANDLING are left as
// the user set them.
absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateNcclGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                                 int rank, int size, int64_t timeout_ms);

}  // namespace rlmesh::dist
