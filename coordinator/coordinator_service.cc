#include "coordinator/coordinator_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/proto_yaml.h"
#include "common/rpc_handler.h"
#include "common/status_macros.h"
#include "coordinator/experiment_config.h"
#include "coordinator/metrics_log.h"

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
    ExperimentConfig config = req->experiment();
    if (!req->has_experiment()) {
      if (req->source_yaml().empty()) return absl::InvalidArgumentError("experiment: absent, and no source_yaml");
      YamlSource src;
      RLMESH_RETURN_IF_ERROR(MergeYaml(req->source_yaml(), &config, &src));
      for (const auto& o : req->overrides()) RLMESH_RETURN_IF_ERROR(ApplyOverride(o, &config, &src));
      RLMESH_RETURN_IF_ERROR(NormalizeExperiment(&config, src));
    } else if (req->overrides_size() > 0) {
      return absl::InvalidArgumentError("overrides: apply only to source_yaml (the experiment is already parsed)");
    }
    auto id = experiments->Submit(std::move(config));
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

grpc::ServerUnaryReactor* CoordinatorServiceImpl::GetMetrics(grpc::CallbackServerContext* ctx,
                                                             const MetricsRequest* req,
                                                             MetricsResponse* resp) {
  return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
    if (req->limit() < 0 || req->limit() > 10000) {
      return absl::InvalidArgumentError(absl::StrCat("limit: ", req->limit(), " is outside [0, 10000]"));
    }
    ExperimentManager* experiments = experiments_.load();
    if (experiments == nullptr) {
      return absl::NotFoundError(absl::StrCat("experiment_id: unknown experiment '", req->experiment_id(), "'"));
    }
    auto e = req->experiment_id().empty() ? experiments->Newest() : experiments->Status(req->experiment_id());
    if (!e.ok()) return e.status();
    resp->set_experiment_id(e->experiment_id());
    auto page = ReadExperimentMetrics(*e, req->from_record(), req->limit() == 0 ? 1000 : req->limit());
    if (!page.ok()) return page.status();
    for (auto& r : page->records) resp->add_records(std::move(r));
    resp->set_next_record(page->next);
    return absl::OkStatus();
  });
}

}  // namespace rlmesh
