#pragma once

// How a rollout worker reaches the replay buffer: a small interface with a
// gRPC implementation (deadline per attempt, retries with backoff on
// UNAVAILABLE / DEADLINE_EXCEEDED, wait-for-ready reconnection when the
// buffer restarts) and fakes in tests. PutGroups is idempotent by
// trajectory id on the server, so retrying a call that may have landed is
// safe.

#include <memory>

#include "absl/status/statusor.h"
#include "common/rpc_client.h"
#include "proto/replay_buffer.pb.h"

namespace rlmesh::rollout {

// Safe for concurrent use.
class ReplayBufferClient {
 public:
  virtual ~ReplayBufferClient() = default;
  virtual absl::StatusOr<PutGroupsResponse> PutGroups(const PutGroupsRequest& request) = 0;
};

// Same retry policy (RetryOptions) as the reward client.
std::unique_ptr<ReplayBufferClient> MakeGrpcReplayBufferClient(RpcClient client, RetryOptions retry = {});

}  // namespace rlmesh::rollout
