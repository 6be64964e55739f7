#pragma once

// How the experiment loop reaches the roles it drives: one small interface
// per role kind, a real gRPC implementation (grpc_role_clients.h: every call
// carries a deadline) and hand-written fakes for tests
// (testing/fake_roles.h). The loop never builds a stub itself.
//
// Every method returns the role's status unchanged (the loop adds "learner 2
// Configure: ..." context and decides whether to recover), so a fake returns
// exactly what a real role would: UNAVAILABLE for a dead process, ABORTED
// for a stale policy version, and so on.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/learner.pb.h"
#include "proto/replay_buffer.pb.h"
#include "proto/rollout.pb.h"
#include "reward_server/client.h"

namespace rlmesh {

// One learner shard. Safe for concurrent use (the loop calls every shard
// from its own thread, and Publish alongside the rollouts' LoadWeights).
class LearnerClient {
 public:
  virtual ~LearnerClient() = default;
  virtual absl::StatusOr<ConfigureResponse> Configure(const ConfigureRequest& request) = 0;
  virtual absl::StatusOr<SaveResponse> Save(const SaveRequest& request) = 0;
  virtual absl::StatusOr<TrainStepResponse> TrainStep(const TrainStepRequest& request) = 0;
  // Hosts the process's c10d store (idempotent); the loop asks learner 0.
  virtual absl::StatusOr<HostStoreResponse> HostStore(const HostStoreRequest& request) = 0;
  // Rank 0 only. `timeout`: the call's deadline (the group's timeout plus
  // slack, since the publish is a collective with the rollout workers).
  virtual absl::StatusOr<PublishWeightsResponse> PublishWeights(const PublishWeightsRequest& request,
                                                                absl::Duration timeout) = 0;
};

// One rollout worker. Safe for concurrent use (the async producer thread
// generates while the training thread loads weights).
class RolloutClient {
 public:
  virtual ~RolloutClient() = default;
  // The answer names the dtype the worker's parameters have.
  virtual absl::StatusOr<ConfigureWeightSyncResponse> ConfigureWeightSync(
      const ConfigureWeightSyncRequest& request) = 0;
  virtual absl::Status LoadWeights(const LoadWeightsRequest& request) = 0;
  virtual absl::StatusOr<RolloutStatus> GetStatus() = 0;
  // Frees the worker's memory while it is idle (rollout.sleep); the next
  // LoadWeights wakes it.
  virtual absl::StatusOr<SleepResponse> Sleep(const SleepRequest& request) = 0;
  // Streams the request's groups to `on_response` as they finish. When
  // `on_response` returns an error the stream is cancelled and Generate
  // returns that error; else Generate returns the stream's final status.
  // At `timeout` the call is cancelled and returns DEADLINE_EXCEEDED (the
  // groups already handed to `on_response` stay delivered; none follows).
  virtual absl::Status Generate(const GenerateRequest& request, absl::Duration timeout,
                                const std::function<absl::Status(GenerateResponse&)>& on_response) = 0;
};

// The replay buffer's control calls (trajectories never pass through the
// coordinator). Safe for concurrent use.
class ReplayBufferAdminClient {
 public:
  virtual ~ReplayBufferAdminClient() = default;
  virtual absl::StatusOr<TrimResponse> Trim(const TrimRequest& request) = 0;
};

// Whether one role process serves (grpc.health.v1). Safe for concurrent use.
class RoleHealth {
 public:
  virtual ~RoleHealth() = default;
  // Name for errors and logs ("learner 0 at host:port").
  virtual std::string name() const = 0;
  // OK once the role reports SERVING; DEADLINE_EXCEEDED after `timeout`.
  virtual absl::Status WaitUntilServing(absl::Duration timeout) = 0;
};

// Everything the loop talks to. Owned by the runner; the clients outlive
// every thread the loop starts.
struct RoleClients {
  std::unique_ptr<ReplayBufferAdminClient> replay_buffer;
  // Eval completions are scored by the first; RL rewards never pass here.
  std::vector<std::unique_ptr<RewardClient>> rewards;
  std::vector<std::unique_ptr<RolloutClient>> rollouts;
  // Index = learner rank.
  std::vector<std::unique_ptr<LearnerClient>> learners;
  // One per role process: what recovery waits on after a role died.
  std::vector<std::unique_ptr<RoleHealth>> health;
};

}  // namespace rlmesh
