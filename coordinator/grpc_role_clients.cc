#include "coordinator/grpc_role_clients.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc_client.h"
#include "common/status_macros.h"
#include "proto/learner.grpc.pb.h"
#include "proto/replay_buffer.grpc.pb.h"
#include "proto/reward.grpc.pb.h"
#include "proto/rollout.grpc.pb.h"

namespace rlmesh {
namespace {

// Each client holds an RpcClient (thread-safe) and builds a stub per call,
// which is cheap: the channel is shared. Hence safe for concurrent use.

// One unary call under a deadline of `timeout`.
template <typename Response>
absl::StatusOr<Response> Unary(const RpcClient& client, absl::Duration timeout,
                               const std::function<grpc::Status(grpc::ClientContext*, Response*)>& call) {
  Response resp;
  auto ctx = client.NewContext(timeout);
  RLMESH_RETURN_IF_ERROR(FromGrpcStatus(call(ctx.get(), &resp)));
  return resp;
}

class GrpcLearnerClient : public LearnerClient {
 public:
  explicit GrpcLearnerClient(RpcClient c) : c_(std::move(c)) {}

  absl::StatusOr<ConfigureResponse> Configure(const ConfigureRequest& req) override {
    return Unary<ConfigureResponse>(c_, absl::Minutes(10), [&](grpc::ClientContext* ctx, ConfigureResponse* resp) {
      return Learner::NewStub(c_.channel())->Configure(ctx, req, resp);
    });
  }
  absl::StatusOr<SaveResponse> Save(const SaveRequest& req) override {
    return Unary<SaveResponse>(c_, absl::Minutes(10), [&](grpc::ClientContext* ctx, SaveResponse* resp) {
      return Learner::NewStub(c_.channel())->Save(ctx, req, resp);
    });
  }
  absl::StatusOr<TrainStepResponse> TrainStep(const TrainStepRequest& req) override {
    return Unary<TrainStepResponse>(c_, absl::Minutes(30), [&](grpc::ClientContext* ctx, TrainStepResponse* resp) {
      return Learner::NewStub(c_.channel())->TrainStep(ctx, req, resp);
    });
  }
  absl::StatusOr<HostStoreResponse> HostStore(const HostStoreRequest& req) override {
    return Unary<HostStoreResponse>(c_, absl::Seconds(30), [&](grpc::ClientContext* ctx, HostStoreResponse* resp) {
      return Learner::NewStub(c_.channel())->HostStore(ctx, req, resp);
    });
  }
  absl::StatusOr<PublishWeightsResponse> PublishWeights(const PublishWeightsRequest& req,
                                                        absl::Duration timeout) override {
    return Unary<PublishWeightsResponse>(c_, timeout, [&](grpc::ClientContext* ctx, PublishWeightsResponse* resp) {
      return Learner::NewStub(c_.channel())->PublishWeights(ctx, req, resp);
    });
  }

 private:
  const RpcClient c_;
};

class GrpcRolloutClient : public RolloutClient {
 public:
  explicit GrpcRolloutClient(RpcClient c) : c_(std::move(c)) {}

  absl::StatusOr<ConfigureWeightSyncResponse> ConfigureWeightSync(const ConfigureWeightSyncRequest& req) override {
    return Unary<ConfigureWeightSyncResponse>(
        c_, absl::Minutes(1), [&](grpc::ClientContext* ctx, ConfigureWeightSyncResponse* resp) {
          return RolloutService::NewStub(c_.channel())->ConfigureWeightSync(ctx, req, resp);
        });
  }
  absl::Status LoadWeights(const LoadWeightsRequest& req) override {
    return Unary<LoadWeightsResponse>(c_, absl::Minutes(5),
                                      [&](grpc::ClientContext* ctx, LoadWeightsResponse* resp) {
                                        return RolloutService::NewStub(c_.channel())->LoadWeights(ctx, req, resp);
                                      })
        .status();
  }
  absl::StatusOr<RolloutStatus> GetStatus() override {
    return Unary<RolloutStatus>(c_, absl::Seconds(30), [&](grpc::ClientContext* ctx, RolloutStatus* st) {
      return RolloutService::NewStub(c_.channel())->GetStatus(ctx, RolloutStatusRequest(), st);
    });
  }
  absl::StatusOr<SleepResponse> Sleep(const SleepRequest& req) override {
    return Unary<SleepResponse>(c_, absl::Minutes(1), [&](grpc::ClientContext* ctx, SleepResponse* resp) {
      return RolloutService::NewStub(c_.channel())->Sleep(ctx, req, resp);
    });
  }
  absl::Status Generate(const GenerateRequest& req, absl::Duration timeout,
                        const std::function<absl::Status(GenerateResponse&)>& on_response) override {
    auto stub = RolloutService::NewStub(c_.channel());
    // The deadline cancels the stream on both ends: the worker drops the
    // request's queued and running sequences.
    auto ctx = c_.NewContext(std::min(timeout, absl::Minutes(30)));
    auto reader = stub->Generate(ctx.get(), req);
    GenerateResponse resp;
    while (reader->Read(&resp)) {
      absl::Status s = on_response(resp);
      if (!s.ok()) {
        ctx->TryCancel();
        reader->Finish().ok();  // the cancellation's status; `s` says why
        return s;
      }
    }
    return FromGrpcStatus(reader->Finish());
  }

 private:
  const RpcClient c_;
};

class GrpcRewardClient : public RewardClient {
 public:
  explicit GrpcRewardClient(RpcClient c) : c_(std::move(c)) {}
  absl::StatusOr<ScoreResponse> Score(const ScoreRequest& req, absl::Duration timeout) override {
    return Unary<ScoreResponse>(c_, std::min(timeout, absl::Minutes(5)), [&](grpc::ClientContext* ctx,
                                                                          ScoreResponse* resp) {
      return RewardService::NewStub(c_.channel())->Score(ctx, req, resp);
    });
  }

 private:
  const RpcClient c_;
};

class GrpcReplayBufferAdminClient : public ReplayBufferAdminClient {
 public:
  explicit GrpcReplayBufferAdminClient(RpcClient c) : c_(std::move(c)) {}
  absl::StatusOr<TrimResponse> Trim(const TrimRequest& req) override {
    return Unary<TrimResponse>(c_, absl::Seconds(60), [&](grpc::ClientContext* ctx, TrimResponse* resp) {
      return ReplayBuffer::NewStub(c_.channel())->Trim(ctx, req, resp);
    });
  }

 private:
  const RpcClient c_;
};

class GrpcRoleHealth : public RoleHealth {
 public:
  GrpcRoleHealth(std::string name, RpcClient c) : name_(std::move(name)), c_(std::move(c)) {}
  std::string name() const override { return name_; }
  absl::Status WaitUntilServing(absl::Duration timeout) override { return rlmesh::WaitUntilServing(c_, timeout); }

 private:
  const std::string name_;
  const RpcClient c_;
};

}  // namespace

absl::StatusOr<RoleClients> ConnectRoles(const RoleAddresses& a) {
  ClientOptions co;
  co.auth_token = a.auth_token;
  co.default_timeout = absl::Minutes(30);
  RoleClients out;
  // Health checks go first, in the order recovery waits on them.
  auto connect = [&](const std::string& role, const std::string& addr) -> absl::StatusOr<RpcClient> {
    RLMESH_ASSIGN_OR_RETURN(RpcClient c, RpcClient::Create(addr, co));
    out.health.push_back(std::make_unique<GrpcRoleHealth>(absl::StrCat(role, " at ", addr), c));
    return c;
  };
  RLMESH_ASSIGN_OR_RETURN(RpcClient rb, connect("replay buffer", a.replay_buffer));
  out.replay_buffer = std::make_unique<GrpcReplayBufferAdminClient>(std::move(rb));
  for (size_t i = 0; i < a.reward_servers.size(); ++i) {
    RLMESH_ASSIGN_OR_RETURN(RpcClient c, connect(absl::StrCat("reward server ", i), a.reward_servers[i]));
    out.rewards.push_back(std::make_unique<GrpcRewardClient>(std::move(c)));
  }
  for (size_t i = 0; i < a.rollout_workers.size(); ++i) {
    RLMESH_ASSIGN_OR_RETURN(RpcClient c, connect(absl::StrCat("rollout ", i), a.rollout_workers[i]));
    out.rollouts.push_back(std::make_unique<GrpcRolloutClient>(std::move(c)));
  }
  for (size_t i = 0; i < a.learners.size(); ++i) {
    RLMESH_ASSIGN_OR_RETURN(RpcClient c, connect(absl::StrCat("learner ", i), a.learners[i]));
    out.learners.push_back(std::make_unique<GrpcLearnerClient>(std::move(c)));
  }
  return out;
}

}  // namespace rlmesh
