#include "replay_buffer/client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "proto/replay_buffer.grpc.pb.h"

namespace rlmesh {
namespace {

// Immutable after construction; the stub and channel are thread-safe.
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

  absl::StatusOr<SampleGroupsResponse> SampleGroups(const SampleGroupsRequest& request,
                                                    absl::Duration timeout) override {
    SampleGroupsResponse response;
    auto ctx = client_.NewContext(timeout);
    absl::Status s = FromGrpcStatus(stub_->SampleGroups(ctx.get(), request, &response));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("replay buffer SampleGroups: ", s.message()));
    return response;
  }

  absl::Status AckSample(const AckSampleRequest& request) override {
    AckSampleResponse response;
    auto ctx = client_.NewContext();
    return FromGrpcStatus(stub_->AckSample(ctx.get(), request, &response));
  }

 private:
  const RpcClient client_;
  const RetryOptions retry_;
  const std::unique_ptr<ReplayBuffer::Stub> stub_;
};

}  // namespace

std::unique_ptr<ReplayBufferClient> MakeGrpcReplayBufferClient(RpcClient client, RetryOptions retry) {
  return std::make_unique<GrpcReplayBufferClient>(std::move(client), retry);
}

}  // namespace rlmesh
