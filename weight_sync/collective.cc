#include "weight_sync/internal.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <vector>

#include "dist/store.h"

namespace rlmesh::weight_sync::internal {
namespace {

class CollectivePublisher final : public WeightPublisher {
 public:
  CollectivePublisher(const WeightSyncSpec& spec, WeightSyncBackend backend, std::unique_ptr<BroadcastGroup> group)
      : spec_(spec), backend_(backend), group_(std::move(group)) {}
  absl::StatusOr<WeightLayout> Publish(const NamedTensors& tensors, int64_t version) override {
    RLMESH_RETURN_IF_ERROR(CheckVersionForward(version, last_));
    RLMESH_ASSIGN_OR_RETURN(WeightLayout layout, BuildLayout(tensors, version, BucketBytes(spec_)));
    // Pack first: once the header is out, receivers wait for every bucket.
    std::vector<at::Tensor> buckets;
    try {
      for (int64_t b : layout.bucket_bytes()) buckets.push_back(at::empty({b}, at::kByte));
      PackInto(tensors, layout, [&](int i) { return buckets[i].data_ptr(); });
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("weight sync (", group_->name(), "): copying tensors: ", e.what()));
    }
    std::string bytes = layout.SerializeAsString();
    int64_t header[2] = {version, static_cast<int64_t>(bytes.size())};
    RLMESH_RETURN_IF_ERROR(group_->Broadcast(header, sizeof(header)));
    RLMESH_RETURN_IF_ERROR(group_->Broadcast(bytes.data(), static_cast<int64_t>(bytes.size())));
    for (auto& b : buckets) RLMESH_RETURN_IF_ERROR(group_->Broadcast(b.data_ptr(), b.numel()));
    last_ = version;
    return layout;
  }
  WeightSyncBackend backend() const override { return backend_; }

 private:
  const WeightSyncSpec spec_;
  const WeightSyncBackend backend_;
  std::unique_ptr<BroadcastGroup> group_;
  int64_t last_ = 0;
};

class CollectiveReceiver final : public WeightReceiver {
 public:
  CollectiveReceiver(const WeightSyncSpec& spec, WeightSyncBackend backend, std::unique_ptr<BroadcastGroup> group)
      : spec_(spec), backend_(backend), group_(std::move(group)) {}
  absl::StatusOr<NamedTensors> Receive(const WeightLayout& expected, WeightLayout* received) override {
    if (expected.version() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("layout.version: must be > 0, got ", expected.version()));
    }
    int64_t header[2] = {0, 0};
    RLMESH_RETURN_IF_ERROR(group_->Broadcast(header, sizeof(header)));
    const int64_t n = header[1];
    if (n <= 0 || n > (int64_t{1} << 30)) {
      return absl::DataLossError(absl::StrCat("weight sync (", group_->name(), "): bad layout size ", n));
    }
    std::string bytes(static_cast<size_t>(n), '\0');
    RLMESH_RETURN_IF_ERROR(group_->Broadcast(bytes.data(), n));
    WeightLayout layout;
    if (!layout.ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat("weight sync (", group_->name(), "): corrupt layout"));
    }
    std::vector<at::Tensor> buckets;
    for (int64_t b : layout.bucket_bytes()) {
      if (b < 0) return absl::DataLossError(absl::StrCat("weight sync (", group_->name(), "): negative bucket size"));
      buckets.push_back(at::empty({b}, at::kByte));
    }
    for (auto& b : buckets) RLMESH_RETURN_IF_ERROR(group_->Broadcast(b.data_ptr(), b.numel()));
    RLMESH_RETURN_IF_ERROR(CheckExpected(expected, layout));
    RLMESH_RETURN_IF_ERROR(ValidateLayout(layout));
    if (received) *received = layout;
    return UnpackFrom(layout, [&](int i) { return buckets[i].data_ptr(); });
  }
  WeightSyncBackend backend() const override { return backend_; }

 private:
  const WeightSyncSpec spec_;
  const WeightSyncBackend backend_;
  std::unique_ptr<BroadcastGroup> group_;
};

}  // namespace

// The TCPStore at spec.store_host:store_port under
// "weight_sync/<group_name><suffix>", the rendezvous of one group.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> GroupStore(const WeightSyncSpec& spec, const std::string& suffix) {
  RLMESH_ASSIGN_OR_RETURN(auto store, dist::MakeTcpStore(spec.store_host(), spec.store_port(), /*is_server=*/false,
                                                            spec.world_size(), TimeoutMs(spec)));
  try {
    return c10::intrusive_ptr<c10d::Store>(
        c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("weight_sync/", spec.group_name(), suffix), store));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("weight sync store: ", e.what()));
  }
}

absl::Status BrokenGroup(const char* backend, const WeightSyncSpec& spec) {
  return absl::FailedPreconditionError(absl::StrCat("weight sync (", backend, " ", spec.group_name(),
                                                    "): the group failed earlier; configure a new group"));
}

std::unique_ptr<WeightPublisher> NewCollectivePublisher(const WeightSyncSpec& spec, WeightSyncBackend backend,
                                                        std::unique_ptr<BroadcastGroup> group) {
  return std::make_unique<CollectivePublisher>(spec, backend, std::move(group));
}

std::unique_ptr<WeightReceiver> NewCollectiveReceiver(const WeightSyncSpec& spec, WeightSyncBackend backend,
                                                      std::unique_ptr<BroadcastGroup> group) {
  return std::make_unique<CollectiveReceiver>(spec, backend, std::move(group));
}

// The GLOO or NCCL group of `spec`. NCCL: FAILED_PRECONDITION naming the
// missing library or device; nothing connects yet (groups form lazily).
absl::StatusOr<std::unique_ptr<BroadcastGroup>> MakeBroadcastGroup(const WeightSyncSpec& spec) {
  if (ResolveBackend(spec) == WEIGHT_SYNC_GLOO) return std::unique_ptr<BroadcastGroup>(NewGlooGroup(spec).release());
  auto nccl = LoadNccl();
  if (!nccl.ok()) return absl::FailedPreconditionError(absl::StrCat("NCCL backend: ", nccl.status().message()));
  RLMESH_ASSIGN_OR_RETURN(const CudaRuntimeApi* cuda, RequireCuda("NCCL"));
  RLMESH_ASSIGN_OR_RETURN(int devices, CudaDeviceCount());
  return std::unique_ptr<BroadcastGroup>(NewNcclGroup(spec, cuda, *nccl, spec.rank() % devices).release());
}

}  // namespace rlmesh::weight_sync::internal
