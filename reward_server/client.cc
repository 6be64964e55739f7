#include "reward_server/client.h"

#include "common/grpc_status.h"
#include "common/log.h"
#include "proto/reward.grpc.pb.h"

namespace rlmesh {
namespace {

class GrpcRewardClient final : public RewardClient {
 public:
  GrpcRewardClient(RpcClient client, RetryOptions retry)
      : client_(std::move(client)), retry_(retry), stub_(RewardService::NewStub(client_.channel())) {}

  absl::StatusOr<ScoreResponse> Score(const ScoreRequest& request) override {
    const absl::Time give_up = absl::Now() + retry_.total_timeout;
    absl::Duration backoff = retry_.initial_backoff;
    for (int attempt = 1;; ++attempt) {
      ScoreResponse response;
      auto ctx = client_.NewContext(std::min(retry_.attempt_timeout, give_up - absl::Now()));
      // Wait for a (re)connecting channel within the deadline instead of
      // failing fast while the server restarts.
      ctx->set_wait_for_ready(true);
      absl::Status s = FromGrpcStatus(stub_->Score(ctx.get(), request, &response));
      if (s.ok()) return response;
      const bool retryable = s.code() == absl::StatusCode::kUnavailable ||
                             s.code() == absl::StatusCode::kDeadlineExceeded;
      if (!retryable || absl::Now() + backoff >= give_up) return s;
      RLMESH_LOG(WARNING) << "reward server " << client_.address() << " attempt=" << attempt
                          << " failed: " << s.message() << "; retrying";
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, retry_.max_backoff);
    }
  }

 private:
  RpcClient client_;
  RetryOptions retry_;
  std::unique_ptr<RewardService::Stub> stub_;
};

}  // namespace

std::unique_ptr<RewardClient> MakeGrpcRewardClient(RpcClient client, RetryOptions retry) {
  return std::make_unique<GrpcRewardClient>(std::move(client), retry);
}

}  // namespace rlmesh
