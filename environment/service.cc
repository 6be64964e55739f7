#include "environment/service.h"

#include "common/grpc_status.h"
#include "common/rpc_handler.h"

namespace rlmesh::environment {

grpc::ServerUnaryReactor* EnvironmentServiceImpl::Reset(grpc::CallbackServerContext* ctx, const ResetRequest* req,
                                                        ResetResponse* resp) {
  return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
    auto r = table_->Reset(*req);
    if (!r.ok()) return r.status();
    *resp = std::move(*r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* EnvironmentServiceImpl::Step(grpc::CallbackServerContext* ctx, const StepRequest* req,
                                                       StepResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status auth = auth_->Check(*ctx);
  if (!auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  // req/resp stay valid until Finish; the table outlives the service.
  const bool scheduled = steps_.Schedule([this, reactor, req, resp] {
    absl::StatusOr<StepResponse> r = table_->Step(*req);
    if (r.ok()) *resp = std::move(*r);
    reactor->Finish(ToGrpcStatus(r.status()));
  });
  if (!scheduled) reactor->Finish(ToGrpcStatus(absl::UnavailableError("environment server shutting down")));
  return reactor;
}

grpc::ServerUnaryReactor* EnvironmentServiceImpl::Close(grpc::CallbackServerContext* ctx, const CloseRequest* req,
                                                        CloseResponse*) {
  return HandleUnary(ctx, *auth_, [&] {
    table_->Close(req->episode_id());
    return absl::OkStatus();
  });
}

}  // namespace rlmesh::environment
