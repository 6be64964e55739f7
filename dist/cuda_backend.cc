#include "dist/cuda_backend.h"

#include <dlfcn.h>
#include <limits.h>

#include <atomic>

#include "absl/strings/str_cat.h"

namespace rlmesh::dist {
namespace {
std::atomic<bool> cuda_backend_requested{false};
}  // namespace

absl::Status LoadCudaBackend() {
  cuda_backend_requested = true;
  static const absl::Status* loaded = [] {
    // libtorch_cuda.so resolves its own CUDA libraries (cuBLAS, cuDNN,
    // NCCL...) through its RPATH into the nvidia wheels beside torch.
    void* h = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
      const char* e = dlerror();
      return new absl::Status(absl::FailedPreconditionError(absl::StrCat(
          "libtorch_cuda.so not found (dlopen: ", e != nullptr ? e : "unknown error",
          "); the torch wheel must be a CUDA build and its lib/ on the library path")));
    }
    return new absl::Status();
  }();
  return *loaded;
}

bool CudaBackendRequested() { return cuda_backend_requested; }

std::string LoadedTorchLibDir() {
  // RTLD_NOLOAD finds a loaded object by its soname without loading one;
  // the handle only holds a reference until dlclose.
  for (const char* soname : {"libtorch_cuda.so", "libtorch_cpu.so", "libc10.so"}) {
    void* h = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) continue;
    char origin[PATH_MAX + 1] = {0};
    const bool found = dlinfo(h, RTLD_DI_ORIGIN, origin) == 0 && origin[0] != '\0';
    dlclose(h);
    if (found) return origin;
  }
  dlerror();  // the NOLOAD misses leave a message; clear it
  return "";
}

}  // namespace rlmesh::dist
