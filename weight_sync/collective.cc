#include "weight_sync/internal.h"

#include <ATen/ops/from_blob.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <array>
#include <vector>

#include "dist/device.h"
#include "dist/store.h"

namespace rlmesh::weight_sync::internal {
namespace {

// The bytes of `slot` inside `bucket` (a byte tensor), seen as the slot's
// dtype and shape. REQUIRES: ValidateLayout ok; offsets are aligned to
// kSlotAlignment, so the view is always allowed.
at::Tensor SlotView(const at::Tensor& bucket, const TensorSlot& slot) {
  const at::ScalarType dtype = *DtypeFromName(slot.dtype());
  std::vector<int64_t> shape(slot.shape().begin(), slot.shape().end());
  return bucket.narrow(0, slot.byte_offset(), SlotBytes(slot, dtype)).view(dtype).view(shape);
}

// The layout's tensor indices, bucket by bucket.
std::vector<std::vector<int>> SlotsByBucket(const WeightLayout& layout) {
  std::vector<std::vector<int>> by_bucket(layout.bucket_bytes_size());
  for (int i = 0; i < layout.tensors_size(); ++i) by_bucket[layout.tensors(i).bucket()].push_back(i);
  return by_bucket;
}

// Two byte buffers on `device`, each as large as the largest bucket (one
// when there is one bucket): bucket b goes through buffers[b % 2].
std::array<at::Tensor, 2> NewBuffers(const WeightLayout& layout, const c10::Device& device) {
  int64_t largest = 0;
  for (int64_t b : layout.bucket_bytes()) largest = std::max(largest, b);
  std::array<at::Tensor, 2> buffers;
  const auto options = at::TensorOptions().dtype(at::kByte).device(device);
  for (int k = 0; k < std::min(2, layout.bucket_bytes_size()); ++k) buffers[k] = at::empty({largest}, options);
  return buffers;
}

at::Tensor BucketBuffer(const std::array<at::Tensor, 2>& buffers, const WeightLayout& layout, int b) {
  return buffers[b % 2].narrow(0, 0, layout.bucket_bytes(b));
}

class CollectivePublisher final : public WeightPublisher {
 public:
  CollectivePublisher(const WeightSyncSpec& spec, WeightSyncBackend backend, std::unique_ptr<BroadcastGroup> group)
      : spec_(spec), backend_(backend), group_(std::move(group)) {}

  absl::StatusOr<WeightLayout> Publish(const NamedTensors& tensors, int64_t version) override {
    if (broken_) return BrokenGroup(group_->name(), spec_);
    RLMESH_RETURN_IF_ERROR(CheckVersionForward(version, last_));
    RLMESH_ASSIGN_OR_RETURN(WeightLayout layout, BuildLayout(tensors, version, BucketBytes(spec_)));
    const std::vector<std::vector<int>> slots = SlotsByBucket(layout);
    // The buffers come first: once the header is out, the receivers wait
    // for every bucket.
    std::array<at::Tensor, 2> buffers;
    try {
      buffers = NewBuffers(layout, group_->device());
    } catch (const std::exception& e) {
      return dist::ExceptionStatus(e, absl::StatusCode::kInternal, What("allocating two buckets"));
    }
    std::string bytes = layout.SerializeAsString();
    int64_t header[2] = {version, static_cast<int64_t>(bytes.size())};
    RLMESH_RETURN_IF_ERROR(BroadcastHostBytes(*group_, header, sizeof(header)));
    RLMESH_RETURN_IF_ERROR(BroadcastHostBytes(*group_, bytes.data(), static_cast<int64_t>(bytes.size())));
    for (int b = 0; b < layout.bucket_bytes_size(); ++b) {
      // Bucket b is packed while bucket b - 1 is on the wire.
      at::Tensor bucket = BucketBuffer(buffers, layout, b);
      try {
        for (int i : slots[b]) SlotView(bucket, layout.tensors(i)).copy_(tensors[i].second.detach());
      } catch (const std::exception& e) {
        // The receivers wait for this bucket, which will not come: they
        // fail by their deadline, and this group is done.
        broken_ = true;
        (void)group_->Wait();
        return dist::ExceptionStatus(e, absl::StatusCode::kInternal, What("copying tensors into a bucket"));
      }
      absl::Status s = group_->Wait();
      if (s.ok()) s = group_->Start(bucket);
      if (!s.ok()) {
        broken_ = true;
        return s;
      }
    }
    if (absl::Status s = group_->Wait(); !s.ok()) {
      broken_ = true;
      return s;
    }
    last_ = version;
    return layout;
  }
  WeightSyncBackend backend() const override { return backend_; }

 private:
  std::string What(absl::string_view doing) const {
    return absl::StrCat("weight sync (", group_->name(), " ", spec_.group_name(), " publisher): ", doing);
  }

  const WeightSyncSpec spec_;
  const WeightSyncBackend backend_;
  std::unique_ptr<BroadcastGroup> group_;
  int64_t last_ = 0;
  bool broken_ = false;
};

class CollectiveReceiver final : public WeightReceiver {
 public:
  CollectiveReceiver(const WeightSyncSpec& spec, WeightSyncBackend backend, std::unique_ptr<BroadcastGroup> group)
      : spec_(spec), backend_(backend), group_(std::move(group)) {}

  absl::StatusOr<NamedTensors> Receive(const WeightLayout& expected, WeightLayout* received) override {
    return ReceiveRound(expected, nullptr, received);
  }
  // Unpacks each bucket straight into the destinations (no tensors of its
  // own): the path the rollout worker takes after its first round.
  absl::Status ReceiveInto(const WeightLayout& expected, const NamedTensors& destinations,
                           WeightLayout* received) override {
    return ReceiveRound(expected, &destinations, received).status();
  }
  WeightSyncBackend backend() const override { return backend_; }

 private:
  std::string What(absl::string_view doing) const {
    return absl::StrCat("weight sync (", group_->name(), " ", spec_.group_name(), " rank ", spec_.rank(), "): ",
                        doing);
  }

  absl::StatusOr<NamedTensors> ReceiveRound(const WeightLayout& expected, const NamedTensors* destinations,
                                            WeightLayout* received) {
    if (expected.version() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("layout.version: must be > 0, got ", expected.version()));
    }
    if (broken_) return BrokenGroup(group_->name(), spec_);
    int64_t header[2] = {0, 0};
    RLMESH_RETURN_IF_ERROR(BroadcastHostBytes(*group_, header, sizeof(header)));
    const int64_t n = header[1];
    if (n <= 0 || n > (int64_t{1} << 30)) {
      broken_ = true;
      return absl::DataLossError(What(absl::StrCat("bad layout size ", n)));
    }
    std::string bytes(static_cast<size_t>(n), '\0');
    RLMESH_RETURN_IF_ERROR(BroadcastHostBytes(*group_, bytes.data(), n));
    WeightLayout layout;
    if (!layout.ParseFromString(bytes)) {
      broken_ = true;
      return absl::DataLossError(What("corrupt layout"));
    }
    for (int64_t b : layout.bucket_bytes()) {
      if (b < 0) {
        broken_ = true;
        return absl::DataLossError(What("negative bucket size"));
      }
    }
    // A round that is not for us is still drained, bucket by bucket, so
    // that the group stays aligned; only its checks' error comes back.
    absl::Status check = CheckExpected(expected, layout);
    if (check.ok()) check = ValidateLayout(layout);
    NamedTensors out;
    const c10::Device device = group_->device();
    if (check.ok() && destinations != nullptr) {
      absl::StatusOr<NamedTensors> ordered = OrderDestinations(layout, *destinations, device);
      if (ordered.ok()) {
        out = *std::move(ordered);
      } else {
        check = ordered.status();
      }
    }
    std::array<at::Tensor, 2> buffers;
    try {
      if (check.ok() && destinations == nullptr) {
        out.reserve(layout.tensors_size());
        for (const TensorSlot& slot : layout.tensors()) {
          std::vector<int64_t> shape(slot.shape().begin(), slot.shape().end());
          out.emplace_back(slot.name(),
                           at::empty(shape, at::TensorOptions().dtype(*DtypeFromName(slot.dtype())).device(device)));
        }
      }
      buffers = NewBuffers(layout, device);
    } catch (const std::exception& e) {
      // The publisher is sending the buckets now and nothing can take them.
      broken_ = true;
      return dist::ExceptionStatus(e, absl::StatusCode::kInternal, What("allocating the tensors and two buckets"));
    }
    // Only a valid layout's slots are unpacked (a slot's bucket may be out
    // of range otherwise).
    const std::vector<std::vector<int>> slots = check.ok() ? SlotsByBucket(layout) : std::vector<std::vector<int>>();
    const int buckets = layout.bucket_bytes_size();
    absl::Status s = buckets > 0 ? group_->Start(BucketBuffer(buffers, layout, 0)) : absl::OkStatus();
    for (int b = 0; s.ok() && b < buckets; ++b) {
      s = group_->Wait();
      // Bucket b is unpacked while bucket b + 1 arrives.
      if (s.ok() && b + 1 < buckets) s = group_->Start(BucketBuffer(buffers, layout, b + 1));
      if (!s.ok() || !check.ok()) continue;
      try {
        const at::Tensor bucket = BucketBuffer(buffers, layout, b);
        for (int i : slots[b]) out[i].second.copy_(SlotView(bucket, layout.tensors(i)));
      } catch (const std::exception& e) {
        check = dist::ExceptionStatus(e, absl::StatusCode::kInternal, What("copying a bucket out"));
      }
    }
    if (!s.ok()) {
      broken_ = true;
      return s;
    }
    RLMESH_RETURN_IF_ERROR(check);
    if (received) *received = layout;
    return out;
  }

  const WeightSyncSpec spec_;
  const WeightSyncBackend backend_;
  std::unique_ptr<BroadcastGroup> group_;
  bool broken_ = false;
};

}  // namespace

absl::Status BroadcastHostBytes(BroadcastGroup& group, void* data, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();  // every rank knows the size: skipped alike
  const at::Tensor host = at::from_blob(data, {bytes}, at::TensorOptions().dtype(at::kByte));
  const c10::Device device = group.device();
  at::Tensor bucket = host;
  try {
    if (!device.is_cpu()) bucket = host.to(device);
  } catch (const std::exception& e) {
    return dist::ExceptionStatus(e, absl::StatusCode::kInternal,
                                 absl::StrCat("weight sync (", group.name(), "): copying a header to ", device.str()));
  }
  RLMESH_RETURN_IF_ERROR(group.Start(bucket));
  RLMESH_RETURN_IF_ERROR(group.Wait());
  if (device.is_cpu()) return absl::OkStatus();
  try {
    host.copy_(bucket);
  } catch (const std::exception& e) {
    return dist::ExceptionStatus(e, absl::StatusCode::kInternal,
                                 absl::StrCat("weight sync (", group.name(), "): copying a header from ", device.str()));
  }
  return absl::OkStatus();
}

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
  RLMESH_ASSIGN_OR_RETURN(const int device, CudaDeviceOf(spec, devices));
  // The buckets are LibTorch tensors on that GPU: its CUDA backend must load.
  RLMESH_RETURN_IF_ERROR(
      dist::ResolveDevice(absl::StrCat("cuda:", device), absl::StrCat("NCCL backend rank ", spec.rank())).status());
  return std::unique_ptr<BroadcastGroup>(NewNcclGroup(spec, cuda, *nccl, device).release());
}

}  // namespace rlmesh::weight_sync::internal
