#pragma once

// How other processes reach a reward server: a small interface with a real
// gRPC implementation (deadline, retries with backoff on UNAVAILABLE, and
// reconnection when the server restarts) and fakes in tests.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_client.h"
#include "proto/reward.pb.h"

namespace rlmesh {

// Safe for concurrent use: the rollout worker's pipeline threads share one
// client. Implementations (fakes included) must allow concurrent Score calls.
class RewardClient {
 public:
  virtual ~RewardClient() = default;
  // One call, retries inside the client included, that returns by
  // `timeout` (DEADLINE_EXCEEDED then); InfiniteDuration() leaves the
  // client's own deadline.
  virtual absl::StatusOr<ScoreResponse> Score(const ScoreRequest& request, absl::Duration timeout) = 0;
};

// Retries UNAVAILABLE and DEADLINE_EXCEEDED attempts (a restarting server)
// and RESOURCE_EXHAUSTED ones (a server past its --score_queue, or whose
// verifier queue is full) with exponential backoff (CallWithRetry) within
// retry.total_timeout and the call's `timeout`, whichever ends first; other
// errors return at once. The last failure is what the call returns.
std::unique_ptr<RewardClient> MakeGrpcRewardClient(RpcClient client, RetryOptions retry = {});

}  // namespace rlmesh
