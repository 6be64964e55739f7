#include "dist/store.h"
#include "weight_sync/weight_sync.h"

#include "common/status_macros.h"

namespace rlmesh::weight_sync {

struct WeightSyncStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

WeightSyncStore::WeightSyncStore(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}
WeightSyncStore::~WeightSyncStore() = default;

absl::StatusOr<std::unique_ptr<WeightSyncStore>> WeightSyncStore::Host(const std::string& host, int port,
                                                                      int world_size, int64_t timeout_ms) {
  RLMESH_ASSIGN_OR_RETURN(auto store, dist::MakeTcpStore(host, port, /*is_server=*/true, world_size, timeout_ms));
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  const int bound = static_cast<int>(store->getPort());
  return std::unique_ptr<WeightSyncStore>(new WeightSyncStore(std::move(impl), bound));
}

}  // namespace rlmesh::weight_sync
