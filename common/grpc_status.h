#pragma once

// absl::Status <-> grpc::Status. The codes are numerically identical by
// design in both libraries; the mapping is still explicit so that a future
// divergence breaks a test, not a production error path.

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace rlmesh {

// Longest status message sent to a client, bytes. Messages name the value
// that was wrong, and a value can be as long as a request; a message sent
// whole went out as a grpc-message trailer over the peer's 8 KiB metadata
// limit, which broke the connection for the calls after it (found by
// fuzz/rollout_rpc_fuzz).
inline constexpr size_t kMaxStatusMessageBytes = 1024;

// `message` cut to kMaxStatusMessageBytes (at a UTF-8 boundary) with
// "... [N more bytes]" appended when longer.
std::string BoundedMessage(absl::string_view message);

// The message is bounded (BoundedMessage).
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace rlmesh
