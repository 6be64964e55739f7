#include "rollout/replay_client.h"

#include "proto/replay_buffer.grpc.pb.h"

namespace rlmesh::rollout {
namespace {

class GrpcReplayBufferClient final : public ReplayBufferClient {
 public:
  GrpcReplayBufferClient(RpcClient client, RetryOptions retry)
      : client_(std::move(client)), retry_(retry), stub_(ReplayBuffer::NewStub(client_.channel())) {}

  absl::StatusOr<PutGroupsResponse> PutGroups(const PutGroupsRequest& request) override {
    PutGroupsResponse response;
    absl::Status s = CallWithRetry(client_, retry_, "replay buffer", [&](grpc::ClientContext* ctx) {
      response.Clear();
      return stub_->PutGroups(ctx, request, &response);
    });
    if (!s.ok()) return s;
    return response;
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
