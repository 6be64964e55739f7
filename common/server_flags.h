#pragma once

// Flags every server binary shares (--bind, --port, --port_file,
// --auth_token_file, --tls_cert, --tls_key, --tls_root_cert, --tls_mutual,
// --trace_file) and the usual main() shape.

#include <functional>

#include "absl/status/statusor.h"
#include "common/rpc_client.h"
#include "common/rpc_server.h"

namespace rlmesh {

// Builds ServerOptions for `role` from the shared flags.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags(const std::string& role);

// The client side of the --tls_* flags: --tls_root_cert verifies servers;
// with --tls_mutual, --tls_cert/--tls_key are presented. InitServerProcess
// makes it the process's (SetProcessClientTls).
ClientTls ClientTlsFromFlags();

// Parses flags (unknown flag -> one line and exit 2), blocks termination
// signals, sets the log role and the process's client TLS. Call first in
// main; returns positional args.
std::vector<char*> InitServerProcess(int argc, char** argv, const std::string& role,
                                     const std::string& usage);

// Writes the --trace_file of this process, if tracing is on (a line on
// stderr if it cannot). ServeUntilSignal calls it after shutting down.
void FinishTrace(const std::string& role);

// Starts `server`, waits for SIGTERM/SIGINT, shuts down within the grace
// period and returns the process exit code (0 on a clean stop, 1 if Start
// failed after printing one clear line).
int ServeUntilSignal(RpcServer& server);

}  // namespace rlmesh
