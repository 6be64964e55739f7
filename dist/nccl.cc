#include "dist/nccl.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dist/device.h"

namespace rlmesh::dist {
namespace {

using NewNcclBackend = void* (*)(void*, int, int, long long, char*, size_t);

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// The entry point of the first candidate that opens, or the reasons.
absl::StatusOr<NewNcclBackend> OpenBackend() {
  std::vector<std::string> tried;
  for (const std::string& path : NcclBackendCandidates()) {
    if (access(path.c_str(), R_OK) != 0) continue;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      tried.push_back(absl::StrCat(path, ": ", e != nullptr ? e : "dlopen failed"));
      continue;
    }
    void* f = dlsym(h, "rlmesh_new_nccl_backend");
    if (f == nullptr) {
      tried.push_back(absl::StrCat(path, ": no rlmesh_new_nccl_backend"));
      continue;
    }
    return reinterpret_cast<NewNcclBackend>(f);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("libnccl_backend.so not found or not loadable (looked in ",
                   absl::StrJoin(NcclBackendCandidates(), ", "), ")",
                   tried.empty() ? "" : absl::StrCat(": ", absl::StrJoin(tried, "; "))));
}

}  // namespace

std::vector<std::string> NcclBackendCandidates() {
  std::vector<std::string> out;
  if (const char* e = std::getenv("RLMESH_NCCL_BACKEND"); e != nullptr && *e != '\0') out.push_back(e);
  const std::string self = SelfPath();
  if (!self.empty()) {
    out.push_back(self.substr(0, self.rfind('/') + 1) + "libnccl_backend.so");
    out.push_back(self + ".runfiles/rlmesh/dist/libnccl_backend.so");
  }
  if (const char* r = std::getenv("RUNFILES_DIR"); r != nullptr && *r != '\0') {
    out.push_back(absl::StrCat(r, "/rlmesh/dist/libnccl_backend.so"));
  }
  out.push_back("dist/libnccl_backend.so");
  return out;
}

absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateNcclGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                                 int rank, int size, int64_t timeout_ms) {
  const std::string who = absl::StrCat("NCCL group (rank ", rank, " of ", size, ")");
  if (absl::Status s = LoadCudaBackend(); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": ", s.message()));
  }
  static const absl::StatusOr<NewNcclBackend>* backend = new absl::StatusOr<NewNcclBackend>(OpenBackend());
  if (!backend->ok()) return absl::FailedPreconditionError(absl::StrCat(who, ": ", backend->status().message()));
  c10::intrusive_ptr<c10d::Store> s = store;
  char error[1024] = {0};
  void* group = (**backend)(&s, rank, size, static_cast<long long>(timeout_ms), error, sizeof(error));
  if (group == nullptr) return absl::FailedPreconditionError(absl::StrCat(who, ": ", error));
  return c10::intrusive_ptr<c10d::Backend>::reclaim(static_cast<c10d::Backend*>(group));
}

}  // namespace rlmesh::dist
