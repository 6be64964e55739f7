#pragma once

// absl::Status <-> grpc::Status. The codes are numerically identical by
// design in both libraries; the mapping is still explicit so that a future
// divergence breaks a test, not a production error path.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace rlmesh {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace rlmesh
