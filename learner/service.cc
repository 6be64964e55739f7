#include "learner/service.h"

#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/rpc_handler.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "dist/device.h"
#include "weight_sync/weight_sync.h"

namespace rlmesh::learner {

namespace {

// With tracing on: the step as a span, and its phases (sampling from the
// buffer, forward+backward, optimizer) as spans in the order they ran, from
// the durations the step measured itself.
void TraceTrainStep(int64_t start_us, const TrainStepResponse& resp) {
  if (!TracingEnabled()) return;
  const int64_t end_us = absl::ToUnixMicros(absl::Now());
  RecordSpan("train_step", "learner", start_us, end_us - start_us,
             absl::StrCat("{\"policy_version\":", resp.policy_version(), "}"));
  int64_t at = start_us;
  for (const char* phase : {"seconds_sample", "seconds_forward_backward", "seconds_optimizer"}) {
    auto it = resp.metrics().values().find(phase);
    if (it == resp.metrics().values().end() || !(it->second > 0)) continue;
    const int64_t dur = static_cast<int64_t>(it->second * 1e6);
    RecordSpan(std::string(phase).substr(8), "learner", at, dur);
    at += dur;
  }
}

}  // namespace

LearnerService::LearnerService(Trainer* trainer, const ServerAuth* auth, ClientOptions client_options)
    : trainer_(trainer), auth_(auth), client_options_(std::move(client_options)), worker_(1, "learner-work") {}

LearnerService::~LearnerService() { Shutdown(); }

void LearnerService::set_group_source_for_test(GroupSource* source) {
  // Refused only after Shutdown, when no call will use the source.
  (void)worker_.Schedule([this, source] {
    test_source_ = source;
    trainer_->set_group_source(source);
  });
}

void LearnerService::Shutdown() { worker_.Stop(); }

grpc::ServerUnaryReactor* LearnerService::Offload(grpc::CallbackServerContext* ctx,
                                                  std::function<absl::Status()> work) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status auth = auth_->Check(*ctx);
  if (!auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  // The request and response stay valid until Finish.
  const bool queued = worker_.Schedule([reactor, work = std::move(work)] {
    absl::Status st;
    try {
      st = work();
    } catch (const std::exception& e) {
      st = dist::ExceptionStatus(e, absl::StatusCode::kInternal, "unexpected exception");
    }
    reactor->Finish(ToGrpcStatus(st));
  });
  if (!queued) reactor->Finish(ToGrpcStatus(absl::UnavailableError("learner is shutting down")));
  return reactor;
}

grpc::ServerUnaryReactor* LearnerService::Configure(grpc::CallbackServerContext* ctx,
                                                    const ConfigureRequest* req,
                                                    ConfigureResponse* resp) {
  return Offload(ctx, [this, req, resp]() -> absl::Status {
    auto r = trainer_->Configure(*req);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    if (test_source_ != nullptr) {
      trainer_->set_group_source(test_source_);
    } else if (!req->replay_buffer_address().empty()) {
      auto src = ReplayBufferGroupSource::Create(req->replay_buffer_address(), client_options_);
      if (!src.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("replay_buffer_address: ", src.status().message()));
      }
      source_ = *std::move(src);
      trainer_->set_group_source(source_.get());
    } else {
      trainer_->set_group_source(nullptr);
      source_.reset();
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* LearnerService::TrainStep(grpc::CallbackServerContext* ctx,
                                                    const TrainStepRequest* req,
                                                    TrainStepResponse* resp) {
  return Offload(ctx, [this, req, resp]() -> absl::Status {
    const int64_t start = absl::ToUnixMicros(absl::Now());
    auto r = trainer_->TrainStep(*req);
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    TraceTrainStep(start, *resp);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* LearnerService::Save(grpc::CallbackServerContext* ctx, const SaveRequest* req,
                                               SaveResponse* resp) {
  return Offload(ctx, [this, req, resp]() -> absl::Status {
    auto r = trainer_->Save(req->path());
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* LearnerService::Load(grpc::CallbackServerContext* ctx, const LoadRequest* req,
                                               LoadResponse* resp) {
  return Offload(ctx, [this, req, resp]() -> absl::Status {
    auto r = trainer_->Load(req->path());
    if (!r.ok()) return r.status();
    *resp = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* LearnerService::PublishWeights(grpc::CallbackServerContext* ctx,
                                                         const PublishWeightsRequest* req,
                                                         PublishWeightsResponse* resp) {
  return Offload(ctx, [this, req, resp]() -> absl::Status {
    LearnerStatus status = trainer_->Status();
    if (status.stage().empty()) {
      return absl::FailedPreconditionError("learner is not configured (call Configure first)");
    }
    const WeightSyncSpec& spec = req->spec();
    RLMESH_RETURN_IF_ERROR(weight_sync::ValidateSpec(spec));
    // A piece comes from the rank that holds it (Trainer::PolicyPiece); the
    // whole model from rank 0.
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    if (spec.pieces() > 1) {
      auto piece = trainer_->PolicyPiece(spec.piece(), spec.pieces());
      if (!piece.ok()) return piece.status();
      tensors = *std::move(piece);
    } else {
      auto whole = trainer_->SyncTensors();
      if (!whole.ok()) return whole.status();
      tensors = *std::move(whole);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const int key = spec.pieces() > 1 ? spec.piece() : -1;
    Publisher& slot = publishers_[key];
    const std::string serialized = spec.SerializeAsString();
    if (!slot.publisher || serialized != slot.spec) {
      slot.publisher.reset();
      // NCCL and CUDA IPC run on the device the policy lives on.
      WeightSyncSpec own = spec;
      if (!tensors.empty() && tensors.front().second.is_cuda()) own.set_device(tensors.front().second.device().str());
      auto pub = weight_sync::CreateWeightPublisher(own);
      if (!pub.ok()) return pub.status();
      slot.publisher = *std::move(pub);
      slot.spec = serialized;
    }
    auto layout = slot.publisher->Publish(tensors, status.policy_version());
    if (!layout.ok()) {
      // A failed publisher may be unusable; the next call builds a new one.
      slot.publisher.reset();
      return layout.status();
    }
    *resp->mutable_layout() = *std::move(layout);
    resp->set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* LearnerService::HostStore(grpc::CallbackServerContext* ctx, const HostStoreRequest* req,
                                                    HostStoreResponse* resp) {
  return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
    if (req->timeout_ms() < 0) return absl::InvalidArgumentError("timeout_ms: must be >= 0");
    absl::MutexLock lock(&store_mu_);
    if (!store_) {
      // Binding a listening socket (every interface): no wait on any peer,
      // the ranks connect when their group forms. The world size only
      // sizes the server's bookkeeping; groups of any size share it.
      auto store = weight_sync::WeightSyncStore::Host("127.0.0.1", 0, /*world_size=*/2,
                                                      req->timeout_ms() > 0 ? req->timeout_ms() : 60000);
      if (!store.ok()) return store.status();
      store_ = *std::move(store);
      RLMESH_LOG(INFO) << "c10d store port=" << store_->port();
    }
    resp->set_port(store_->port());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* LearnerService::GetStatus(grpc::CallbackServerContext* ctx,
                                                    const LearnerStatusRequest*, LearnerStatus* resp) {
  return HandleUnary(ctx, *auth_, [&] {
    *resp = trainer_->Status();
    return absl::OkStatus();
  });
}

}  // namespace rlmesh::learner
