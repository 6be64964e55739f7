#include "reward_server/client.h"

#include <algorithm>

#include "common/grpc_status.h"
#include "proto/reward.grpc.pb.h"

namespace rlmesh {
namespace {

// Immutable after construction; the stub and channel are thread-safe, so
// concurrent Score calls need no lock.
class GrpcRewardClient final : public RewardClient {
 public:
  GrpcRewardClient(RpcClient client, RetryOptions retry)
      : client_(std::move(client)), retry_(retry), stub_(RewardService::NewStub(client_.channel())) {
    // A full server refuses at once and is free again after a backoff.
    retry_.retry_resource_exhausted = true;
  }

  absl::StatusOr<ScoreResponse> Score(const ScoreRequest& request, absl::Duration timeout) override {
    RetryOptions retry = retry_;
    retry.total_timeout = std::min(retry.total_timeout, timeout);
    retry.attempt_timeout = std::min(retry.attempt_timeout, timeout);
    ScoreResponse response;
    absl::Status s = CallWithRetry(client_, retry, "reward server", [&](grpc::ClientContext* ctx) {
      response.Clear();
      return stub_->Score(ctx, request, &response);
    });
    if (!s.ok()) return s;
    return response;
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
