#include "common/server_flags.h"

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/trace.h"

ABSL_FLAG(std::string, bind, "127.0.0.1",
          "Address to bind; loopback by default. Use 0.0.0.0 to serve other hosts.");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one (reported on stdout).");
ABSL_FLAG(std::string, port_file, "", "Write the bound port to this file.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding a shared token every RPC must carry (off if empty).");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; with --tls_key enables TLS.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert.");
ABSL_FLAG(std::string, trace_file, "",
          "Record spans (generate, score, train phases, RPCs) and write them as a Chrome trace-event "
          "JSON file here at shutdown (Perfetto / chrome://tracing open it). Off if empty.");
ABSL_FLAG(double, shutdown_grace_seconds, 1.0,
          "On SIGTERM, in-flight calls get this long before they are cancelled.");

namespace rlmesh {

absl::StatusOr<ServerOptions> ServerOptionsFromFlags(const std::string& role) {
  ServerOptions options;
  options.role = role;
  options.bind_address = absl::GetFlag(FLAGS_bind);
  options.port = absl::GetFlag(FLAGS_port);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  RLMESH_ASSIGN_OR_RETURN(options.auth_token, ReadTokenFile(absl::GetFlag(FLAGS_auth_token_file)));
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.shutdown_grace = absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds));
  RLMESH_RETURN_IF_ERROR(options.Validate());
  return options;
}

std::vector<char*> InitServerProcess(int argc, char** argv, const std::string& role,
                                     const std::string& usage) {
  BlockTerminationSignals();
  SetLogRole(role);
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_trace_file).empty()) EnableTracing(absl::GetFlag(FLAGS_trace_file), role);
  return args;
}

void FinishTrace(const std::string& role) {
  absl::Status s = FlushTrace();
  if (!s.ok()) std::fprintf(stderr, "%s: trace not written: %s\n", role.c_str(), s.ToString().c_str());
}

int ServeUntilSignal(RpcServer& server) {
  absl::Status started = server.Start();
  if (!started.ok()) {
    std::fprintf(stderr, "%s: %s\n", server.options().role.c_str(), started.ToString().c_str());
    return 1;
  }
  const int sig = WaitForTerminationSignal();
  RLMESH_LOG(INFO) << "signal=" << sig << " shutting down";
  server.Shutdown();
  FinishTrace(server.options().role);
  return 0;
}

}  // namespace rlmesh
