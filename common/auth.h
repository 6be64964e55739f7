#pragma once

// Optional shared-token authentication. When a token is configured every
// call must carry the metadata "authorization: Bearer <token>"; calls without
// it fail with UNAUTHENTICATED. Off (empty token) by default.
//
// The check happens inside each handler (see rpc_handler.h) rather than in a
// gRPC interceptor because a server interceptor in gRPC 1.51 cannot fail a
// call before the handler runs. docs/decisions.md has the details.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace rlmesh {

inline constexpr char kAuthMetadataKey[] = "authorization";

// Immutable after construction; safe for concurrent use.
class ServerAuth {
 public:
  ServerAuth() = default;
  explicit ServerAuth(std::string token) : token_(std::move(token)) {}

  bool enabled() const { return !token_.empty(); }

  // OK if auth is off or the call carries the right token.
  absl::Status Check(const grpc::ServerContextBase& context) const;

 private:
  std::string token_;
};

// Attaches the token (if non-empty) to an outgoing call.
void AttachToken(absl::string_view token, grpc::ClientContext* context);

// Reads a token file (whitespace trimmed). Empty path -> empty token.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The whole of a credential file (a token, a PEM certificate or key):
// NOT_FOUND "cannot read <what> file <path>" when it cannot be opened,
// INVALID_ARGUMENT "<what> file <path> is empty" when it holds nothing.
absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, absl::string_view what);

}  // namespace rlmesh
