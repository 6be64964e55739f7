#include <algorithm>

#include "common/device_spec.h"
#include "weight_sync/internal.h"

namespace rlmesh::weight_sync {

using internal::MakeBroadcastGroup;
using internal::OrderDestinations;
using internal::RequireCuda;
using namespace internal;  // the backends' constructors

absl::Status WeightReceiver::ReceiveInto(const WeightLayout& expected, const NamedTensors& destinations,
                                         WeightLayout* received) {
  WeightLayout layout;
  RLMESH_ASSIGN_OR_RETURN(NamedTensors got, Receive(expected, &layout));
  RLMESH_ASSIGN_OR_RETURN(NamedTensors ordered, OrderDestinations(layout, destinations));
  for (size_t i = 0; i < got.size(); ++i) ordered[i].second.copy_(got[i].second);
  if (received) *received = layout;
  return absl::OkStatus();
}

absl::Status ValidateSpec(const WeightSyncSpec& spec) {
  // At most an hour: a receive whose publisher never comes holds the
  // worker's weight-load turn this long, and larger values overflow the
  // deadline arithmetic of c10d's stores.
  if (spec.timeout_ms() < 0 || spec.timeout_ms() > kMaxWeightSyncTimeoutMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.timeout_ms: ", spec.timeout_ms(), " is outside [0, ", kMaxWeightSyncTimeoutMs, "]"));
  }
  if (spec.bucket_mb() < 0) return absl::InvalidArgumentError("spec.bucket_mb: must be >= 0");
  if (spec.pieces() < 0 || spec.pieces() > kMaxWeightPieces) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.pieces: ", spec.pieces(), " is outside [0, ", kMaxWeightPieces, "]"));
  }
  if (spec.piece() < 0 || spec.piece() >= std::max(spec.pieces(), 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.piece: ", spec.piece(), " is outside [0, pieces=", std::max(spec.pieces(), 1), ")"));
  }
  if (!WeightSyncBackend_IsValid(spec.backend())) return absl::InvalidArgumentError("spec.backend: unknown value");
  if (!spec.dtype().empty() && !DtypeFromName(spec.dtype()).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.dtype: unknown \"", spec.dtype(), "\" (f32, bf16 or f16)"));
  }
  const WeightSyncBackend backend = ResolveBackend(spec);
  if (backend == WEIGHT_SYNC_GLOO || backend == WEIGHT_SYNC_NCCL) {
    if (spec.store_host().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.store_host: required for ", WeightSyncBackend_Name(backend)));
    }
    if (spec.store_port() <= 0 || spec.store_port() > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("spec.store_port: invalid ", spec.store_port()));
    }
    if (spec.world_size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.world_size: must be >= 2 (publisher + receivers), got ", spec.world_size()));
    }
    if (spec.rank() < 0 || spec.rank() >= spec.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.rank: must be in [0, ", spec.world_size(), "), got ", spec.rank()));
    }
  }
  return absl::OkStatus();
}

WeightSyncBackend ResolveBackend(const WeightSyncSpec& spec) {
  if (spec.backend() != WEIGHT_SYNC_AUTO) return spec.backend();
  const std::string& h = spec.store_host();
  const bool one_host = h.empty() || h == "127.0.0.1" || h == "localhost" || h == "::1";
  return one_host ? WEIGHT_SYNC_SHM : WEIGHT_SYNC_GLOO;
}

absl::StatusOr<int> CudaDeviceOf(const WeightSyncSpec& spec, int visible_devices) {
  const std::string who = absl::StrCat("weight sync rank ", spec.rank(), " spec.device");
  absl::StatusOr<int> index = ParseDeviceSpec(spec.device(), who);
  if (!index.ok()) return absl::FailedPreconditionError(index.status().message());
  if (*index < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": ", WeightSyncBackend_Name(ResolveBackend(spec)), " moves weights between GPUs, but this process's are on ",
        spec.device().empty() ? "the CPU (no device given)" : spec.device()));
  }
  if (*index >= visible_devices) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": ", spec.device(), " but this process sees ", visible_devices, " CUDA device(s)"));
  }
  return *index;
}

absl::StatusOr<NamedTensors> CastForSync(const NamedTensors& tensors, const std::string& dtype) {
  if (dtype.empty()) return tensors;
  RLMESH_ASSIGN_OR_RETURN(const at::ScalarType to, DtypeFromName(dtype));
  NamedTensors out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    const bool cast = t.defined() && t.is_floating_point() && t.scalar_type() != to;
    out.emplace_back(name, cast ? t.to(to) : t);
  }
  return out;
}

namespace {

// Publishes through `inner` what CastForSync(spec.dtype) makes of the
// tensors: the cast runs on the tensors' device, one whole copy at a time.
class CastingPublisher final : public WeightPublisher {
 public:
  CastingPublisher(std::unique_ptr<WeightPublisher> inner, std::string dtype)
      : inner_(std::move(inner)), dtype_(std::move(dtype)) {}
  absl::StatusOr<WeightLayout> Publish(const NamedTensors& tensors, int64_t version) override {
    RLMESH_ASSIGN_OR_RETURN(NamedTensors cast, CastForSync(tensors, dtype_));
    return inner_->Publish(cast, version);
  }
  WeightSyncBackend backend() const override { return inner_->backend(); }

 private:
  std::unique_ptr<WeightPublisher> inner_;
  const std::string dtype_;
};

absl::StatusOr<std::unique_ptr<WeightPublisher>> CreateBackendPublisher(const WeightSyncSpec& spec) {
  switch (ResolveBackend(spec)) {
    case WEIGHT_SYNC_SHM: return std::unique_ptr<WeightPublisher>(NewShmPublisher(spec).release());
    case WEIGHT_SYNC_IN_PROCESS: return std::unique_ptr<WeightPublisher>(NewInProcessPublisher(spec).release());
    case WEIGHT_SYNC_GLOO:
    case WEIGHT_SYNC_NCCL: {
      if (spec.rank() != 0) {
        return absl::InvalidArgumentError(absl::StrCat("spec.rank: the publisher is rank 0, got ", spec.rank()));
      }
      RLMESH_ASSIGN_OR_RETURN(auto group, MakeBroadcastGroup(spec));
      return std::unique_ptr<WeightPublisher>(NewCollectivePublisher(spec, ResolveBackend(spec), std::move(group)).release());
    }
    case WEIGHT_SYNC_CUDA_IPC: {
      RLMESH_ASSIGN_OR_RETURN(const CudaRuntimeApi* cuda, RequireCuda("CUDA_IPC"));
      RLMESH_ASSIGN_OR_RETURN(const int devices, CudaDeviceCount());
      RLMESH_ASSIGN_OR_RETURN(const int device, CudaDeviceOf(spec, devices));
      return std::unique_ptr<WeightPublisher>(NewCudaIpcPublisher(spec, cuda, device).release());
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.backend: ", WeightSyncBackend_Name(ResolveBackend(spec)), " has no publisher"));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<WeightPublisher>> CreateWeightPublisher(const WeightSyncSpec& spec) {
  RLMESH_RETURN_IF_ERROR(ValidateSpec(spec));
  RLMESH_ASSIGN_OR_RETURN(std::unique_ptr<WeightPublisher> publisher, CreateBackendPublisher(spec));
  if (spec.dtype().empty()) return publisher;
  return std::unique_ptr<WeightPublisher>(new CastingPublisher(std::move(publisher), spec.dtype()));
}

absl::StatusOr<std::unique_ptr<WeightReceiver>> CreateWeightReceiver(const WeightSyncSpec& spec) {
  RLMESH_RETURN_IF_ERROR(ValidateSpec(spec));
  switch (ResolveBackend(spec)) {
    case WEIGHT_SYNC_SHM: return std::unique_ptr<WeightReceiver>(NewShmReceiver(spec).release());
    case WEIGHT_SYNC_IN_PROCESS: return std::unique_ptr<WeightReceiver>(NewInProcessReceiver(spec).release());
    case WEIGHT_SYNC_GLOO:
    case WEIGHT_SYNC_NCCL: {
      if (spec.rank() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec.rank: receivers are ranks 1..", spec.world_size() - 1, ", got ", spec.rank()));
      }
      RLMESH_ASSIGN_OR_RETURN(auto group, MakeBroadcastGroup(spec));
      return std::unique_ptr<WeightReceiver>(NewCollectiveReceiver(spec, ResolveBackend(spec), std::move(group)).release());
    }
    case WEIGHT_SYNC_CUDA_IPC: {
      RLMESH_ASSIGN_OR_RETURN(const CudaRuntimeApi* cuda, RequireCuda("CUDA_IPC"));
      return std::unique_ptr<WeightReceiver>(NewCudaIpcReceiver(spec, cuda).release());
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.backend: ", WeightSyncBackend_Name(ResolveBackend(spec)), " has no receiver"));
  }
}

}  // namespace rlmesh::weight_sync
