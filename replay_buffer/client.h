#pragma once

// ReplayBufferClient: how the other processes reach the replay buffer (the
// rollout worker stores scored groups, the learner samples and acknowledges
// them). A small interface with one gRPC implementation and fakes in tests.
//
// Every call has a deadline:
//   PutGroups    RetryOptions.attempt_timeout per attempt, retried with
//                backoff on UNAVAILABLE / DEADLINE_EXCEEDED (wait-for-ready
//                reconnection when the buffer restarts) for at most
//                RetryOptions.total_timeout. Safe to retry: the server is
//                idempotent by trajectory id.
//   SampleGroups one attempt with the caller's `timeout` (a retry would
//                only wait again; a FIFO lease not acknowledged is
//                redelivered by the server anyway).
//   AckSample    one attempt with ClientOptions.default_timeout; a lost ack
//                only means the groups are delivered again.

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_client.h"
#include "proto/replay_buffer.pb.h"

namespace rlmesh {

// Safe for concurrent use: the rollout worker's pipeline threads share one.
class ReplayBufferClient {
 public:
  virtual ~ReplayBufferClient() = default;
  virtual absl::StatusOr<PutGroupsResponse> PutGroups(const PutGroupsRequest& request) = 0;
  // Errors carry "replay buffer SampleGroups: " before the server's message.
  virtual absl::StatusOr<SampleGroupsResponse> SampleGroups(const SampleGroupsRequest& request,
                                                            absl::Duration timeout) = 0;
  virtual absl::Status AckSample(const AckSampleRequest& request) = 0;
};

// The gRPC client over `client`'s channel; `retry` applies to PutGroups.
std::unique_ptr<ReplayBufferClient> MakeGrpcReplayBufferClient(RpcClient client, RetryOptions retry = {});

}  // namespace rlmesh
