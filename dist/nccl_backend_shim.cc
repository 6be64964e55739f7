// The body of libnccl_backend.so: LibTorch's c10d::ProcessGroupNCCL behind
// one C entry point, so that the binaries, which link only LibTorch's CPU
// libraries, can have it by dlopen (dist/nccl.cc) where a GPU is asked for.
// Only this shared object links libtorch_cuda.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <c10/util/Exception.h>

// `store` points at a c10::intrusive_ptr<c10d::Store>. Returns a
// c10d::Backend* holding one reference (the caller reclaims it), or null
// with the reason in `error` (LibTorch's message, without its backtrace).
extern "C" __attribute__((visibility("default"))) void* rlmesh_new_nccl_backend(void* store, int rank, int size,
                                                                              long long timeout_ms, char* error,
                                                                              size_t error_len) {
  try {
    // Work::wait blocks the caller and throws when the timeout passes, as a
    // Gloo group's does (the caller's dist::Collective makes it ABORTED);
    // without it ProcessGroupNCCL's watchdog ends the whole process. A value
    // the user set stands.
    setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = std::chrono::milliseconds(timeout_ms);
    auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(
        *static_cast<c10::intrusive_ptr<c10d::Store>*>(store), rank, size, options);
    return static_cast<c10d::Backend*>(group.release());
  } catch (const c10::Error& e) {
    std::snprintf(error, error_len, "%s", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
  }
  return nullptr;
}
