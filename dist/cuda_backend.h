#pragma once

// LibTorch's CUDA backend (libtorch_cuda.so) opened with dlopen, and where
// the loaded LibTorch lives. No LibTorch headers: dist/cuda_api.h loads the
// backend before it looks for libcudart and libnccl, so that it gets the
// ones LibTorch loaded (dist/device.h has the device-facing functions).
//
// The binaries link only LibTorch's CPU libraries. libtorch_cuda.so, which
// registers the CUDA kernels with the dispatcher when it is loaded, is
// opened the first time CUDA is asked for: a CPU process pays nothing for it
// (linked, it cost every process ~0.3 s at start and ~350 MB of resident
// memory on these machines; docs/design/gpu.md), and a machine without a
// GPU, a driver or the CUDA wheels still runs every binary.
//
// Thread-safety: every function is safe for concurrent use; the backend is
// loaded at most once per process.

#include <string>

#include "absl/status/status.h"

namespace rlmesh::dist {

// Opens LibTorch's CUDA backend (RTLD_GLOBAL, kept for the process's life).
// The first call's result is kept. FAILED_PRECONDITION
// "libtorch_cuda.so not found (dlopen: ...)" when the wheel has no CUDA
// build or the library is not on the search path.
absl::Status LoadCudaBackend();

// True once LoadCudaBackend has been called in this process, whatever it
// returned (the CUDA allocator may have read its settings by then).
bool CudaBackendRequested();

// The folder of the LibTorch loaded in this process (libtorch_cuda.so's,
// else libtorch_cpu.so's or libc10.so's), e.g.
// ".../site-packages/torch/lib"; "" when none is loaded. Loads nothing.
std::string LoadedTorchLibDir();

}  // namespace rlmesh::dist
