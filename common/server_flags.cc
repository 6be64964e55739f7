#include "common/server_flags.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/registration.h"
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
ABSL_FLAG(std::string, tls_root_cert, "",
          "PEM root certificate(s): every RPC this process makes (to other roles, the coordinator) "
          "uses TLS and verifies the server with them. Off if empty.");
ABSL_FLAG(bool, tls_mutual, false,
          "Mutual TLS: this server refuses clients without a certificate chaining to --tls_root_cert, "
          "and this process's clients present --tls_cert/--tls_key.");
ABSL_FLAG(std::string, trace_file, "",
          "Record spans (generate, score, train phases, RPCs) and write them as a Chrome trace-event "
          "JSON file here at shutdown (Perfetto / chrome://tracing open it). Off if empty.");
ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT of a coordinator to Register with and heartbeat to (off if empty).");
ABSL_FLAG(std::string, instance_name, "",
          "Name registered with --coordinator (e.g. rollout-1); default the role.");
ABSL_FLAG(std::string, advertise_address, "",
          "HOST[:PORT] other hosts reach this server at; default: --advertise_interface's "
          "address, else --bind unless it is a wildcard, else the address that routes to "
          "--coordinator.");
ABSL_FLAG(std::string, advertise_interface, "",
          "Network interface whose IPv4 address is advertised (e.g. eth1).");
ABSL_FLAG(std::vector<std::string>, capabilities, {},
          "Comma-separated capabilities registered with --coordinator (e.g. shm,gloo).");
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
  if (absl::GetFlag(FLAGS_tls_mutual)) {
    if (absl::GetFlag(FLAGS_tls_root_cert).empty() || options.tls_cert_file.empty()) {
      return absl::InvalidArgumentError("--tls_mutual needs --tls_root_cert, --tls_cert and --tls_key");
    }
    options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_root_cert);
  }
  options.shutdown_grace = absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds));
  RLMESH_RETURN_IF_ERROR(options.Validate());
  return options;
}

ClientTls ClientTlsFromFlags() {
  ClientTls tls;
  tls.root_cert_file = absl::GetFlag(FLAGS_tls_root_cert);
  if (absl::GetFlag(FLAGS_tls_mutual)) {
    tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
    tls.key_file = absl::GetFlag(FLAGS_tls_key);
  }
  return tls;
}

std::vector<char*> InitServerProcess(int argc, char** argv, const std::string& role,
                                     const std::string& usage) {
  BlockTerminationSignals();
  SetLogRole(role);
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_trace_file).empty()) EnableTracing(absl::GetFlag(FLAGS_trace_file), role);
  SetProcessClientTls(ClientTlsFromFlags());
  return args;
}

void FinishTrace(const std::string& role) {
  absl::Status s = FlushTrace();
  if (!s.ok()) std::fprintf(stderr, "%s: trace not written: %s\n", role.c_str(), s.ToString().c_str());
}

Role RoleFromName(const std::string& role) {
  if (role == "rollout_worker") return ROLE_ROLLOUT_WORKER;
  if (role == "reward_server") return ROLE_REWARD_SERVER;
  if (role == "replay_buffer") return ROLE_REPLAY_BUFFER;
  if (role == "learner") return ROLE_LEARNER;
  if (role == "environment_server") return ROLE_ENVIRONMENT;
  return ROLE_UNSPECIFIED;
}

absl::StatusOr<std::unique_ptr<Registration>> RegisterFromFlags(const RpcServer& server) {
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  if (coordinator.empty()) return nullptr;
  RegistrationOptions o;
  o.coordinator = coordinator;
  o.auth_token = server.options().auth_token;
  const std::string name = absl::GetFlag(FLAGS_instance_name);
  o.role.set_name(name.empty() ? server.options().role : name);
  o.role.set_role(RoleFromName(server.options().role));
  auto address = AdvertisedAddress(absl::GetFlag(FLAGS_advertise_address), absl::GetFlag(FLAGS_advertise_interface),
                                   server.options().bind_address, server.port(), coordinator);
  if (!address.ok()) return address.status();
  o.role.set_address(*address);
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  o.role.set_host(host);
  o.role.set_pid(::getpid());
  for (const auto& c : absl::GetFlag(FLAGS_capabilities)) o.role.add_capabilities(c);
  std::printf("rlmesh: %s advertises %s to coordinator %s\n", o.role.name().c_str(), address->c_str(),
              coordinator.c_str());
  std::fflush(stdout);
  return Registration::Start(std::move(o));
}

int ServeUntilSignal(RpcServer& server) {
  absl::Status started = server.Start();
  if (!started.ok()) {
    std::fprintf(stderr, "%s: %s\n", server.options().role.c_str(), started.ToString().c_str());
    return 1;
  }
  auto registration = RegisterFromFlags(server);
  if (!registration.ok()) {
    std::fprintf(stderr, "%s: registration: %s\n", server.options().role.c_str(),
                 registration.status().ToString().c_str());
    server.Shutdown();
    return 1;
  }
  const int sig = WaitForTerminationSignal();
  registration->reset();
  RLMESH_LOG(INFO) << "signal=" << sig << " shutting down";
  server.Shutdown();
  FinishTrace(server.options().role);
  return 0;
}

}  // namespace rlmesh
