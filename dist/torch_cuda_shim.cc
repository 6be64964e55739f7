// The body of libtorch_cuda_shim.so: LibTorch's c10d::ProcessGroupNCCL and
// at::cuda::CUDAGraph, the current CUDA stream and the caching allocator's
// segments behind C entry points, so that the binaries, which link
// only LibTorch's CPU libraries, can have them by dlopen (dist/cuda_shim.h)
// where a GPU is asked for. Only this shared object links libtorch_cuda.
// Every entry point reports failure with LibTorch's message, without its
// backtrace, in `error`; none throws.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>

#include <c10/util/Exception.h>

namespace {

void Report(char* error, size_t error_len) {
  try {
    throw;
  } catch (const c10::Error& e) {
    std::snprintf(error, error_len, "%s", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
  } catch (...) {
    std::snprintf(error, error_len, "unknown exception");
  }
}

// A CUDA graph and, while it is being captured, the side stream that is
// current on its device (capture needs a stream other than the default).
struct Graph {
  at::cuda::CUDAGraph graph;
  std::optional<c10::cuda::CUDAStreamGuard> capturing;
};

}  // namespace

// `store` points at a c10::intrusive_ptr<c10d::Store>. Returns a
// c10d::Backend* holding one reference (the caller reclaims it), or null
// with the reason in `error` (LibTorch's message, without its backtrace).
extern "C" __attribute__((visibility("default"))) void* rlmesh_new_nccl_backend(void* store, int rank, int size,
                                                                              long long timeout_ms, char* error,
                                                                              size_t error_len) {
  try {
    // Work::wait only makes the current CUDA stream wait for the collective;
    // the host goes on. ProcessGroupNCCL's watchdog thread watches every
    // collective against `timeout_ms` and, under its default error handling
    // (TORCH_NCCL_ASYNC_ERROR_HANDLING=3), ends the process once one is past
    // it (dist/nccl.h). The TORCH_NCCL_* variables are left to the user.
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = std::chrono::milliseconds(timeout_ms);
    auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        *static_cast<c10::intrusive_ptr<c10d::Store>*>(store), rank, size, options);
    return static_cast<c10d::Backend*>(group.release());
  } catch (...) {
    Report(error, error_len);
  }
  return nullptr;
}

// A graph to capture into, or null (CUDAGraph's constructor checks the
// device).
extern "C" __attribute__((visibility("default"))) void* rlmesh_cuda_graph_new(char* error, size_t error_len) {
  try {
    return new Graph();
  } catch (...) {
    Report(error, error_len);
  }
  return nullptr;
}

// Captures the calling thread's work on GPU `device`. The work queued there
// so far is waited for; then, with a side stream current (capture needs one
// other than the default), run(ctx, 0) runs once for real (what it sets up
// on first use: cuBLAS workspaces, cached tensors), and run(ctx, 1) is
// captured (thread-local: other threads' CUDA calls go on as usual). `run`
// returns nonzero when it failed (its message is the caller's). The stream
// is restored either way. 0 = the graph can be replayed; 2 = `run` failed.
extern "C" __attribute__((visibility("default"))) int rlmesh_cuda_graph_capture(void* graph, int device,
                                                                              int (*run)(void*, int), void* ctx,
                                                                              char* error, size_t error_len) {
  auto* g = static_cast<Graph*>(graph);
  int rc = 0;
  bool capturing = false;
  try {
    const auto index = static_cast<c10::DeviceIndex>(device);
    c10::cuda::getCurrentCUDAStream(index).synchronize();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
    g->capturing.emplace(side);
    if (run(ctx, 0) != 0) {
      rc = 2;
    } else {
      side.synchronize();
      g->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      capturing = true;
      if (run(ctx, 1) != 0) rc = 2;
      capturing = false;
      g->graph.capture_end();  // throws when the captured work was invalid
      if (rc == 0) side.synchronize();
    }
  } catch (...) {
    Report(error, error_len);
    if (capturing) {
      try {
        g->graph.capture_end();
      } catch (...) {
      }
    }
    if (rc == 0) rc = 1;
  }
  g->capturing.reset();
  return rc;
}

// Launches the captured work on the current stream. 0 = launched.
extern "C" __attribute__((visibility("default"))) int rlmesh_cuda_graph_replay(void* graph, char* error,
                                                                             size_t error_len) {
  try {
    static_cast<Graph*>(graph)->graph.replay();
    return 0;
  } catch (...) {
    Report(error, error_len);
  }
  return 1;
}

extern "C" __attribute__((visibility("default"))) void rlmesh_cuda_graph_free(void* graph) {
  delete static_cast<Graph*>(graph);
}

// LibTorch's current stream on GPU `device` (thread-local in LibTorch: what
// the calling thread's LibTorch work is queued on), as a cudaStream_t in
// `*stream`. 0 = done.
extern "C" __attribute__((visibility("default"))) int rlmesh_cuda_current_stream(int device, void** stream,
                                                                               char* error, size_t error_len) {
  try {
    *stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    return 0;
  } catch (...) {
    Report(error, error_len);
  }
  return 1;
}

// The cudaMalloc'd segment of LibTorch's caching allocator that holds the
// device address `ptr` (a block of it): its start in `*base`, its size in
// `*size`. CUDA IPC shares whole segments, so a block is shared as its
// segment's handle plus `ptr - base`. 0 = done.
extern "C" __attribute__((visibility("default"))) int rlmesh_cuda_base_allocation(void* ptr, void** base,
                                                                                size_t* size, char* error,
                                                                                size_t error_len) {
  try {
    *base = c10::cuda::CUDACachingAllocator::getBaseAllocation(ptr, size);
    return 0;
  } catch (...) {
    Report(error, error_len);
  }
  return 1;
}
