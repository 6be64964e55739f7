#include "reward_server/service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc_handler.h"
#include "common/trace.h"

namespace rlmesh {

absl::Status RewardServiceOptions::Validate() const {
  if (score_threads <= 0) return absl::InvalidArgumentError("score_threads: must be > 0");
  if (score_queue < 0) return absl::InvalidArgumentError("score_queue: must be >= 0");
  return absl::OkStatus();
}

RewardServiceImpl::RewardServiceImpl(const ServerAuth* auth, RewardScorer* scorer,
                                     const RewardServiceOptions& options)
    : auth_(auth),
      scorer_(scorer),
      options_(options),
      score_pool_(options.score_threads, "rs-score", options.score_queue) {}

RewardServiceImpl::~RewardServiceImpl() { Shutdown(); }

void RewardServiceImpl::Shutdown() { score_pool_.Stop(); }

grpc::ServerUnaryReactor* RewardServiceImpl::Score(grpc::CallbackServerContext* ctx, const ScoreRequest* req,
                                                   ScoreResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status auth = auth_->Check(*ctx);
  if (!auth.ok()) {
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  // ctx, req and resp stay valid until Finish; the scorer outlives the
  // service. The client's deadline bounds the wait for the reward model.
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  RewardScorer* const scorer = scorer_;
  absl::Status queued = score_pool_.TrySchedule([scorer, ctx, reactor, req, resp, deadline] {
    // A call that waited while its client gave up (or the server shut
    // down) is not worth scoring.
    if (ctx->IsCancelled()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "Score cancelled while queued"));
      return;
    }
    TraceSpan span("score", "reward");
    absl::StatusOr<ScoreResponse> scored = scorer->Score(*req, deadline);
    if (scored.ok()) *resp = std::move(*scored);
    reactor->Finish(ToGrpcStatus(scored.status()));
  });
  if (queued.code() == absl::StatusCode::kResourceExhausted) {
    reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(
        absl::StrCat("reward server busy: all ", options_.score_threads, " score_threads busy and ",
                     options_.score_queue, " Score calls queued (score_queue); retry later"))));
  } else if (!queued.ok()) {
    reactor->Finish(ToGrpcStatus(absl::UnavailableError("reward server is stopping")));
  }
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
