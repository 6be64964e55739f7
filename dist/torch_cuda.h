#pragma once

// What the GPU weight-sync backends need from LibTorch's CUDA state, from
// libtorch_cuda_shim.so (dist/cuda_shim.h): the stream LibTorch's work is
// queued on, to order a backend's own stream after it with an event; and
// the segment of LibTorch's caching allocator that holds a block, since
// CUDA IPC shares whole cudaMalloc'd segments.
//
// Thread-safety: safe for concurrent use.

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/statusor.h"

namespace rlmesh::dist {

// LibTorch's current stream on GPU `device` for the calling thread (the
// default stream unless the caller set another). FAILED_PRECONDITION when
// the shim is missing; INTERNAL with LibTorch's message otherwise.
absl::StatusOr<cudaStream_t> TorchCurrentStream(int device);

struct AllocatorSegment {
  void* base = nullptr;  // what cudaMalloc returned for the segment
  size_t size = 0;       // the segment's bytes
};

// The segment of LibTorch's caching allocator that holds the device address
// `ptr`. INTERNAL when `ptr` is not the allocator's (LibTorch's message).
absl::StatusOr<AllocatorSegment> CachingAllocatorSegment(void* ptr);

}  // namespace rlmesh::dist
