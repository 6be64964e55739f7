#include "reward_server/service.h"

#include <thread>

#include "common/grpc_status.h"
#include "common/rpc_handler.h"
#include "common/trace.h"

namespace rlmesh {

grpc::ServerUnaryReactor* RewardServiceImpl::Score(grpc::CallbackServerContext* ctx, const ScoreRequest* req,
                                                   ScoreResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status auth = auth_->Check(*ctx);
  if (!auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  // req/resp stay valid until Finish; the scorer outlives the server.
  // The client's deadline bounds the wait for the reward model.
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  std::thread([this, reactor, req, resp, deadline] {
    TraceSpan span("score", "reward");
    absl::StatusOr<ScoreResponse> scored = scorer_->Score(*req, deadline);
    if (scored.ok()) *resp = std::move(*scored);
    reactor->Finish(ToGrpcStatus(scored.status()));
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* RewardServiceImpl::GetStatus(grpc::CallbackServerContext* ctx,
                                                       const RewardStatusRequest*, RewardStatus* resp) {
  return HandleUnary(ctx, *auth_, [&] {
    *resp = scorer_->GetStatus();
    return absl::OkStatus();
  });
}

}  // namespace rlmesh
