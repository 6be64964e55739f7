#include "common/rpc_server.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/auth.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace rlmesh {

absl::Status ServerOptions::Validate() const {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port: ", port, " is not in [0, 65535]"));
  }
  if (bind_address.empty()) return absl::InvalidArgumentError("bind_address: empty");
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert_file and tls_key_file must be set together");
  }
  if (!tls_client_ca_file.empty() && tls_cert_file.empty()) {
    return absl::InvalidArgumentError("tls_client_ca_file: mutual TLS needs tls_cert_file and tls_key_file");
  }
  if (max_message_bytes <= 0) return absl::InvalidArgumentError("max_message_bytes: must be > 0");
  return absl::OkStatus();
}

RpcServer::RpcServer(ServerOptions options)
    : options_(std::move(options)), auth_(options_.auth_token) {}

RpcServer::~RpcServer() { Shutdown(); }

void RpcServer::AddService(grpc::Service* service) { services_.push_back(service); }

std::string RpcServer::address() const {
  // IPv6 literals need brackets in host:port form.
  if (options_.bind_address.find(':') != std::string::npos &&
      options_.bind_address.front() != '[') {
    return absl::StrCat("[", options_.bind_address, "]:", port_);
  }
  return absl::StrCat(options_.bind_address, ":", port_);
}

absl::Status RpcServer::Start() {
  RLMESH_RETURN_IF_ERROR(options_.Validate());
  grpc::EnableDefaultHealthCheckService(true);

  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!options_.tls_cert_file.empty()) {
    RLMESH_ASSIGN_OR_RETURN(std::string cert, ReadCredentialFile(options_.tls_cert_file, "TLS certificate"));
    RLMESH_ASSIGN_OR_RETURN(std::string key, ReadCredentialFile(options_.tls_key_file, "TLS key"));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    if (!options_.tls_client_ca_file.empty()) {
      RLMESH_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadCredentialFile(options_.tls_client_ca_file, "TLS client CA"));
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }

  std::string host = options_.bind_address;
  if (host.find(':') != std::string::npos && host.front() != '[') host = absl::StrCat("[", host, "]");
  grpc::ServerBuilder builder;
  // SO_REUSEPORT would let two servers share a port silently; a port in use
  // must be an error.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  builder.AddListeningPort(absl::StrCat(host, ":", options_.port), creds, &port_);
  for (grpc::Service* s : services_) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", options_.port,
                                               " (port in use or address not local?)"));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  {
    absl::MutexLock lock(&shutdown_mu_);
    server_ = std::move(server);
  }
  if (!options_.port_file.empty()) {
    RLMESH_RETURN_IF_ERROR(WriteFileAtomically(options_.port_file, absl::StrCat(port_, "\n")));
  }
  std::printf("rlmesh: %s listening on %s%s%s\n", options_.role.c_str(), address().c_str(),
              auth_.enabled() ? " (token auth)" : "",
              options_.tls_cert_file.empty() ? "" : (options_.tls_client_ca_file.empty() ? " (tls)" : " (mutual tls)"));
  std::fflush(stdout);
  return absl::OkStatus();
}

void RpcServer::Shutdown() {
  // Held throughout: a concurrent caller returns only after the Wait below.
  absl::MutexLock lock(&shutdown_mu_);
  if (server_ == nullptr || shut_down_) return;
  shut_down_ = true;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(options_.shutdown_grace));
  server_->Wait();
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

}  // namespace rlmesh
