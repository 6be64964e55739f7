#include "coordinator/coordinator_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc_handler.h"

namespace rlmesh {

namespace {
absl::Status NoExperiments() {
  return absl::FailedPreconditionError("this coordinator launched no cluster; start one with `coordinator launch`");
}
}  // namespace

grpc::ServerUnaryReactor* CoordinatorServiceImpl::Submit(grpc::CallbackServerContext* ctx,
                                                         const SubmitRequest* req, SubmitResponse* resp) {
  return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
    ExperimentManager* experiments = experiments_.load();
    if (experiments == nullptr) return NoExperiments();
    auto id = experiments->Submit(req->experiment());
    if (!id.ok()) return id.status();
    resp->set_experiment_id(*id);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::GetStatus(grpc::CallbackServerContext* ctx,
                                                            const StatusRequest* req,
                                                            StatusResponse* resp) {
  return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
    ExperimentManager* experiments = experiments_.load();
    if (experiments != nullptr) {
      auto e = req->experiment_id().empty() ? experiments->Newest() : experiments->Status(req->experiment_id());
      if (e.ok()) {
        *resp->mutable_experiment() = *e;
      } else if (!req->experiment_id().empty()) {
        return e.status();
      }
    } else if (!req->experiment_id().empty()) {
      return absl::NotFoundError(absl::StrCat("experiment_id: unknown experiment '", req->experiment_id(), "'"));
    }
    if (cluster_ != nullptr) {
      for (auto& r : cluster_->Roles()) *resp->add_roles() = std::move(r);
    }
    for (auto& r : registry_->Roles()) *resp->add_roles() = std::move(r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::List(grpc::CallbackServerContext* ctx,
                                                       const ListRequest*, ListResponse* resp) {
  return HandleUnary(ctx, *auth_, [&] {
    ExperimentManager* experiments = experiments_.load();
    if (experiments != nullptr) {
      for (auto& e : experiments->List()) *resp->add_experiments() = std::move(e);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::Cancel(grpc::CallbackServerContext* ctx,
                                                         const CancelRequest* req, CancelResponse* resp) {
  return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
    ExperimentManager* experiments = experiments_.load();
    if (experiments == nullptr) {
      return absl::NotFoundError(absl::StrCat("experiment_id: unknown experiment '", req->experiment_id(), "'"));
    }
    auto state = experiments->Cancel(req->experiment_id());
    if (!state.ok()) return state.status();
    resp->set_state(*state);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::Register(grpc::CallbackServerContext* ctx,
                                                           const RegisterRequest* req,
                                                           RegisterResponse* resp) {
  return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
    absl::Status s = registry_->Register(req->role());
    if (s.ok()) resp->set_heartbeat_interval_seconds(absl::ToDoubleSeconds(registry_->options().heartbeat_interval));
    return s;
  });
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                            const HeartbeatRequest* req,
                                                            HeartbeatResponse* resp) {
  return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
    if (req->name().empty()) return absl::InvalidArgumentError("name: empty");
    if (req->name().size() > 64) return absl::InvalidArgumentError("name: longer than 64 chars");
    resp->set_known(registry_->Heartbeat(req->name()));
    return absl::OkStatus();
  });
}

}  // namespace rlmesh
