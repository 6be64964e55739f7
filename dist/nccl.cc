#include "dist/nccl.h"

#include "absl/strings/str_cat.h"
#include "dist/cuda_shim.h"

namespace rlmesh::dist {

absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateNcclGroup(const c10::intrusive_ptr<c10d::Store>& store,
                                                                 int rank, int size, int64_t timeout_ms) {
  const std::string who = absl::StrCat("NCCL group (rank ", rank, " of ", size, ")");
  using NewNcclBackend = void* (*)(void*, int, int, long long, char*, size_t);
  const absl::StatusOr<void*> entry = TorchCudaShimSymbol("rlmesh_new_nccl_backend");
  if (!entry.ok()) return absl::FailedPreconditionError(absl::StrCat(who, ": ", entry.status().message()));
  c10::intrusive_ptr<c10d::Store> s = store;
  char error[1024] = {0};
  void* group = reinterpret_cast<NewNcclBackend>(*entry)(&s, rank, size, static_cast<long long>(timeout_ms), error,
                                                         sizeof(error));
  if (group == nullptr) return absl::FailedPreconditionError(absl::StrCat(who, ": ", error));
  return c10::intrusive_ptr<c10d::Backend>::reclaim(static_cast<c10d::Backend*>(group));
}

}  // namespace rlmesh::dist
