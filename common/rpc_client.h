#pragma once

// The client side of every rlmesh RPC: a channel plus a context factory that
// always sets a deadline and attaches the auth token. There is no way to get
// a context without a deadline from here.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace rlmesh {

// TLS on the client side of a channel.
struct ClientTls {
  // PEM root certificate(s) to verify the server with; non-empty enables
  // TLS.
  std::string root_cert_file;
  // PEM certificate chain and key this client presents (mutual TLS); both
  // or neither.
  std::string cert_file;
  std::string key_file;
  // Expected server name in its certificate; empty = the host dialled.
  std::string server_name;

  bool enabled() const { return !root_cert_file.empty(); }
};

// The TLS every RpcClient of this process uses when its ClientOptions
// enable none: set once at start, before any client exists (the binaries
// call it from their --tls_* flags, common/server_flags.h), so that every
// channel a role opens — to the buffer, a reward server, the coordinator —
// is verified the same way without passing certificates through each
// layer. Not for concurrent use with RpcClient::Create.
void SetProcessClientTls(ClientTls tls);
const ClientTls& ProcessClientTls();

struct ClientOptions {
  // Token sent as "authorization: Bearer <token>"; empty sends none.
  std::string auth_token;
  // TLS of this channel; when not enabled, the process's (above), else
  // plaintext.
  ClientTls tls;
  // Deadline of a call made with NewContext() and no explicit timeout.
  // Default 10 s.
  absl::Duration default_timeout = absl::Seconds(10);
  // Largest message sent or received, bytes. Default 64 MiB.
  int max_message_bytes = 64 << 20;
};

// Thread-safe: contexts may be created concurrently.
class RpcClient {
 public:
  // Creates a lazily connecting channel to "host:port".
  static absl::StatusOr<RpcClient> Create(const std::string& address,
                                          const ClientOptions& options = {});

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  const std::string& address() const { return address_; }

  // A context with deadline now + timeout and the auth token.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout) const;
  // Same, with options.default_timeout.
  std::unique_ptr<grpc::ClientContext> NewContext() const {
    return NewContext(options_.default_timeout);
  }

 private:
  RpcClient(std::string address, ClientOptions options, std::shared_ptr<grpc::Channel> channel)
      : address_(std::move(address)), options_(std::move(options)), channel_(std::move(channel)) {}

  std::string address_;
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
};

// How a client rides out a peer that restarts.
struct RetryOptions {
  // Deadline of one attempt. Default 30 s.
  absl::Duration attempt_timeout = absl::Seconds(30);
  // Give up after this long in total. Default 120 s.
  absl::Duration total_timeout = absl::Seconds(120);
  // First backoff, doubled up to max_backoff. Defaults 50 ms and 2 s.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // Also retry RESOURCE_EXHAUSTED, for a peer that answers it while its
  // queue is full (a reward server past --score_queue). A message over the
  // size limit is RESOURCE_EXHAUSTED too and is then retried until
  // total_timeout. Default false.
  bool retry_resource_exhausted = false;
};

// Calls `call` with a fresh context per attempt (deadline = attempt_timeout,
// capped by what is left of total_timeout; wait_for_ready, so a restarting
// peer is waited for instead of failing fast) until it succeeds or fails
// with something other than UNAVAILABLE / DEADLINE_EXCEEDED (and
// RESOURCE_EXHAUSTED when retry.retry_resource_exhausted), backing off
// exponentially between attempts. Only for idempotent calls. `peer` names
// the peer in retry logs ("reward server").
absl::Status CallWithRetry(const RpcClient& client, const RetryOptions& retry, const std::string& peer,
                           const std::function<grpc::Status(grpc::ClientContext*)>& call);

// grpc.health.v1 status of a server: "SERVING", "NOT_SERVING", ...
absl::StatusOr<std::string> CheckHealth(const RpcClient& client, absl::Duration timeout,
                                        const std::string& service = "");

// Polls CheckHealth until the server says SERVING or `timeout` passes.
absl::Status WaitUntilServing(const RpcClient& client, absl::Duration timeout);

}  // namespace rlmesh
