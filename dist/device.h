#pragma once

// Where a role computes: "cpu", "cuda" or "cuda:<index>", resolved once per
// process with an error that names the role and the device.
//
// LibTorch's CUDA backend is opened with dlopen the first time a CUDA device
// is asked for (LoadCudaBackend in dist/cuda_backend.h, included here).
//
// Thread-safety: every function is safe for concurrent use; the backend is
// loaded at most once per process.

#include <cstdint>
#include <exception>
#include <string>

#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dist/cuda_backend.h"

namespace rlmesh::dist {

// Devices torch sees once the backend is loaded (0 without a GPU or driver).
// Loads the backend; its error when that fails.
absl::StatusOr<int> TorchCudaDeviceCount();

// Parses and checks `spec` for the process named by `who` (e.g.
// "learner-0 model.device"): "" and "cpu" give the CPU; "cuda" is device 0.
// INVALID_ARGUMENT `<who>: "gpu" is not cpu, cuda or cuda:<index>`;
// FAILED_PRECONDITION `<who>=cuda:1: ...` when the backend cannot load, no
// device is visible (the message gives CUDA_VISIBLE_DEVICES) or the index is
// past the visible devices.
absl::StatusOr<c10::Device> ResolveDevice(absl::string_view spec, absl::string_view who);

// Only the syntax (no backend, no device): what config validation uses.
absl::StatusOr<c10::Device> ParseDevice(absl::string_view spec, absl::string_view who);

// Memory this process holds on `device`, bytes: its resident set for the
// CPU (/proc/self/statm); the CUDA caching allocator's reserved bytes (in
// use or cached) for a CUDA device.
int64_t ProcessMemoryBytes(const c10::Device& device);

// Hands memory that is free but still held back to its owner: on a CUDA
// device the caching allocator's unused blocks (emptyCache), so that
// another process on the GPU can have them; on the CPU, malloc's free pages
// (TCMalloc's ReleaseFreeMemory where the process links it, and glibc's
// malloc_trim).
void ReleaseCachedMemory(const c10::Device& device);

// An exception from LibTorch (or anything else) as a status for the caller,
// prefixed by `context` ("learner-0 TrainStep", "rollout weight swap"):
// running out of memory is RESOURCE_EXHAUSTED "<context>: out of memory:
// <what>", the allocator's message giving the size asked for and the device
// (a CUDA c10::OutOfMemoryError, or the CPU allocator's "can't allocate
// memory"); anything else is `otherwise` "<context>: <what>", LibTorch's
// backtrace left out.
absl::Status ExceptionStatus(const std::exception& e, absl::StatusCode otherwise, absl::string_view context);

// Caps the CUDA caching allocator of this process at `fraction` of each
// device's memory (an allocation past it fails with out-of-memory) by adding
// per_process_memory_fraction to PYTORCH_ALLOC_CONF. It must run before the
// CUDA backend loads (the allocator reads its settings once):
// FAILED_PRECONDITION after. INVALID_ARGUMENT `<who>: <fraction> is not in
// (0, 1]`. It sets an environment variable: call it at the process's start,
// before other threads (the one exception to the thread-safety above).
absl::Status SetCudaMemoryFraction(double fraction, absl::string_view who);

}  // namespace rlmesh::dist
