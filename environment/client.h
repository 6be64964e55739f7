#pragma once

// How the rollout worker reaches an environment server: a small interface
// with a real gRPC implementation and fakes in tests. Every call carries a
// deadline (`timeout`). Reset and Step are not idempotent (an episode is
// made; a turn advances it), so they are tried once; a failure ends the
// episode. Close is best effort.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_client.h"
#include "proto/environment.pb.h"

namespace rlmesh {

// Safe for concurrent use: the rollout worker's environment threads share
// one client. Implementations (fakes included) must allow concurrent calls.
class EnvironmentClient {
 public:
  virtual ~EnvironmentClient() = default;
  virtual absl::StatusOr<ResetResponse> Reset(const ResetRequest& request, absl::Duration timeout) = 0;
  virtual absl::StatusOr<StepResponse> Step(const StepRequest& request, absl::Duration timeout) = 0;
  virtual absl::Status Close(const CloseRequest& request, absl::Duration timeout) = 0;
};

std::unique_ptr<EnvironmentClient> MakeGrpcEnvironmentClient(RpcClient client);

}  // namespace rlmesh
