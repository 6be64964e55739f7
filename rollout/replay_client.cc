#include "rollout/replay_client.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "proto/replay_buffer.grpc.pb.h"

namespace rlmesh::rollout {
namespace {

class GrpcReplayBufferClient final : public ReplayBufferClient {
 public:
  GrpcReplayBufferClient(RpcClient client, RetryOptions retry)
      : client_(std::move(client)), retry_(retry), stub_(ReplayBuffer::NewStub(client_.channel())) {}

  absl::StatusOr<PutGroupsResponse> PutGroups(const PutGroupsRequest& request) override {
    const absl::Time give_up = absl::Now() + retry_.total_timeout;
    absl::Duration backoff = retry_.initial_backoff;
    for (int attempt = 1;; ++attempt) {
      PutGroupsResponse response;
      auto ctx = client_.NewContext(std::min(retry_.attempt_timeout, give_up - absl::Now()));
      ctx->set_wait_for_ready(true);  // ride out a restart within the deadline
      absl::Status s = FromGrpcStatus(stub_->PutGroups(ctx.get(), request, &response));
      if (s.ok()) return response;
      const bool retryable =
          s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded;
      if (!retryable || absl::Now() + backoff >= give_up) return s;
      RLMESH_LOG(WARNING) << "replay buffer " << client_.address() << " attempt=" << attempt
                          << " failed: " << s.message() << "; retrying";
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, retry_.max_backoff);
    }
  }

 private:
  RpcClient client_;
  RetryOptions retry_;
  std::unique_ptr<ReplayBuffer::Stub> stub_;
};

}  // namespace

std::unique_ptr<ReplayBufferClient> MakeGrpcReplayBufferClient(RpcClient client, RetryOptions retry) {
  return std::make_unique<GrpcReplayBufferClient>(std::move(client), retry);
}

}  // namespace rlmesh::rollout
