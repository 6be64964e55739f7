#include "dist/cuda_shim.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/device.h"

namespace rlmesh::dist {
namespace {

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// The handle of the first candidate that opens, or the reasons.
absl::StatusOr<void*> OpenShim() {
  if (absl::Status s = LoadCudaBackend(); !s.ok()) return absl::FailedPreconditionError(s.message());
  std::vector<std::string> tried;
  for (const std::string& path : TorchCudaShimCandidates()) {
    if (access(path.c_str(), R_OK) != 0) continue;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) return h;
    const char* e = dlerror();
    tried.push_back(absl::StrCat(path, ": ", e != nullptr ? e : "dlopen failed"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("libtorch_cuda_shim.so not found or not loadable (looked in ",
                   absl::StrJoin(TorchCudaShimCandidates(), ", "), ")",
                   tried.empty() ? "" : absl::StrCat(": ", absl::StrJoin(tried, "; "))));
}

}  // namespace

std::vector<std::string> TorchCudaShimCandidates() {
  std::vector<std::string> out;
  if (const char* e = std::getenv("RLMESH_TORCH_CUDA_SHIM"); e != nullptr && *e != '\0') out.push_back(e);
  const std::string self = SelfPath();
  if (!self.empty()) {
    out.push_back(self.substr(0, self.rfind('/') + 1) + "libtorch_cuda_shim.so");
    out.push_back(self + ".runfiles/rlmesh/dist/libtorch_cuda_shim.so");
  }
  if (const char* r = std::getenv("RUNFILES_DIR"); r != nullptr && *r != '\0') {
    out.push_back(absl::StrCat(r, "/rlmesh/dist/libtorch_cuda_shim.so"));
  }
  out.push_back("dist/libtorch_cuda_shim.so");
  return out;
}

absl::StatusOr<void*> TorchCudaShimSymbol(const char* symbol) {
  static const auto* shim = new absl::StatusOr<void*>(OpenShim());
  if (!shim->ok()) return shim->status();
  void* f = dlsym(**shim, symbol);
  if (f == nullptr) return absl::FailedPreconditionError(absl::StrCat("libtorch_cuda_shim.so has no ", symbol));
  return f;
}

}  // namespace rlmesh::dist
