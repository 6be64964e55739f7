#pragma once
// CUDA graphs of LibTorch work: at::cuda::CUDAGraph, from
// libtorch_cuda_shim.so (dist/cuda_shim.h). A graph records the kernels a
// piece of code queues once and launches them all again with one call,
// which is what makes a small decode step on a GPU cheap.
//
// Thread-compatible: one thread captures and replays a graph.

#include <functional>
#include <memory>

#include "absl/status/statusor.h"

namespace rlmesh::dist {

class CudaGraph {
 public:
  // Captures what `run` queues on GPU `device` from the calling thread. The
  // work queued there so far is waited for; then, on a side stream, run(false)
  // runs once for real (what it sets up on first use: cuBLAS workspaces,
  // cached tensors; its effects are the caller's), and run(true) is
  // recorded: nothing of it runs. The tensors run(true) allocates come from
  // the graph's own memory pool and keep their addresses, so an output the
  // caller keeps is rewritten by each Replay, and each Replay reads the
  // inputs run(true) read, wherever they are (fill those tensors before).
  // FAILED_PRECONDITION without LibTorch's CUDA backend or the shim;
  // INTERNAL when `run` throws or its work cannot be captured (a host
  // synchronisation, a copy from pageable memory), with the message.
  static absl::StatusOr<std::unique_ptr<CudaGraph>> Capture(int device, const std::function<void(bool)>& run);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Launches the captured kernels again, on the current stream.
  absl::Status Replay();

 private:
  explicit CudaGraph(void* graph) : graph_(graph) {}
  void* graph_;
};

}  // namespace rlmesh::dist
