#pragma once

// A gRPC server the way every rlmesh process runs one: binds 127.0.0.1 unless
// told otherwise, takes port 0 and reports the port it bound (stdout line and
// an optional port file), serves the standard grpc.health.v1 service,
// optional shared-token auth and TLS, and shuts down within a deadline.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "grpcpp/server.h"

namespace rlmesh {

struct ServerOptions {
  // Role name printed in the "listening" line and logs. Default "server".
  std::string role = "server";
  // Address to bind. Default loopback only.
  std::string bind_address = "127.0.0.1";
  // Port; 0 asks the kernel for a free one. Default 0.
  int port = 0;
  // If set, the bound port is written here (common/atomic_file.h).
  std::string port_file;
  // Shared token every call must carry; empty disables auth.
  std::string auth_token;
  // PEM certificate chain and private key; both set enables TLS.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Mutual TLS: PEM root certificate(s) every client's certificate must
  // chain to; a client without one is refused at the handshake. Needs TLS.
  std::string tls_client_ca_file;
  // In-flight calls get this long to finish on shutdown before they are
  // cancelled. Default 1 s.
  absl::Duration shutdown_grace = absl::Seconds(1);
  // Largest message accepted or sent, bytes. Default 64 MiB.
  int max_message_bytes = 64 << 20;

  absl::Status Validate() const;
};

// Owns the grpc::Server; the registered services are not owned.
//
// Thread-safety: AddService() and Start() are called by one thread before
// the server is shared. After Start() returns, the accessors are safe from
// any thread (they read values fixed by Start), and so is Shutdown(): it is
// serialised by a mutex, so concurrent or repeated calls are safe and each
// returns only once the server has stopped. REQUIRES: Shutdown() is not
// called from one of this server's handlers (it waits for them to finish).
class RpcServer {
 public:
  explicit RpcServer(ServerOptions options);
  ~RpcServer();
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  // Registers a service. REQUIRES: before Start(). Not owned; must outlive
  // this server.
  void AddService(grpc::Service* service);

  // Binds and starts serving; prints "rlmesh: <role> listening on
  // <host>:<port>" to stdout and writes the port file.
  absl::Status Start();

  // Marks the server NOT_SERVING, lets in-flight calls finish within the
  // grace period, then cancels the rest. Idempotent; safe from any thread.
  void Shutdown();

  // The bound port. REQUIRES: Start() succeeded.
  int port() const { return port_; }
  // "<bind_address>:<port>".
  std::string address() const;
  // The auth policy every service of this server must apply.
  const ServerAuth& auth() const { return auth_; }
  const ServerOptions& options() const { return options_; }

 private:
  // Constant after construction.
  const ServerOptions options_;
  const ServerAuth auth_;
  // Written by the configuring thread before Start() returns; read-only after.
  std::vector<grpc::Service*> services_;
  int port_ = 0;

  // Held for the whole of Shutdown(), so a second caller waits for the first.
  absl::Mutex shutdown_mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(shutdown_mu_);
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

// Blocks SIGTERM and SIGINT in the calling thread and every thread it
// creates afterwards. Call first thing in main, before any thread starts.
void BlockTerminationSignals();

// Waits until SIGTERM or SIGINT is delivered; returns the signal number.
// REQUIRES: BlockTerminationSignals() was called.
int WaitForTerminationSignal();

}  // namespace rlmesh
