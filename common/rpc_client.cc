#include "common/rpc_client.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/health.grpc.pb.h"

namespace rlmesh {

namespace {

ClientTls& MutableProcessTls() {
  static ClientTls* tls = new ClientTls();
  return *tls;
}

}  // namespace

void SetProcessClientTls(ClientTls tls) { MutableProcessTls() = std::move(tls); }
const ClientTls& ProcessClientTls() { return MutableProcessTls(); }

absl::StatusOr<RpcClient> RpcClient::Create(const std::string& address,
                                            const ClientOptions& options) {
  if (address.empty()) return absl::InvalidArgumentError("address: empty");
  if (options.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("default_timeout: must be > 0");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  const ClientTls& tls = options.tls.enabled() ? options.tls : ProcessClientTls();
  if (tls.enabled()) {
    grpc::SslCredentialsOptions ssl;
    RLMESH_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadCredentialFile(tls.root_cert_file, "TLS root certificate"));
    if (tls.cert_file.empty() != tls.key_file.empty()) {
      return absl::InvalidArgumentError("tls: the client certificate and key must be set together");
    }
    if (!tls.cert_file.empty()) {
      RLMESH_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadCredentialFile(tls.cert_file, "TLS client certificate"));
      RLMESH_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadCredentialFile(tls.key_file, "TLS client key"));
    }
    creds = grpc::SslCredentials(ssl);
    if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  auto channel = grpc::CreateCustomChannel(address, creds, args);
  if (channel == nullptr) return absl::InternalError(absl::StrCat("cannot create channel to ", address));
  return RpcClient(address, options, std::move(channel));
}

std::unique_ptr<grpc::ClientContext> RpcClient::NewContext(absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  AttachToken(options_.auth_token, context.get());
  return context;
}

absl::Status CallWithRetry(const RpcClient& client, const RetryOptions& retry, const std::string& peer,
                           const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  const absl::Time give_up = absl::Now() + retry.total_timeout;
  absl::Duration backoff = retry.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    auto ctx = client.NewContext(std::min(retry.attempt_timeout, give_up - absl::Now()));
    ctx->set_wait_for_ready(true);
    absl::Status s = FromGrpcStatus(call(ctx.get()));
    if (s.ok()) return s;
    const bool retryable =
        s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded ||
        (retry.retry_resource_exhausted && s.code() == absl::StatusCode::kResourceExhausted);
    if (!retryable || absl::Now() + backoff >= give_up) return s;
    RLMESH_LOG(WARNING) << peer << " " << client.address() << " attempt=" << attempt << " failed: " << s.message()
                        << "; retrying";
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, retry.max_backoff);
  }
}

absl::StatusOr<std::string> CheckHealth(const RpcClient& client, absl::Duration timeout,
                                        const std::string& service) {
  grpc::health::v1::Health::Stub stub(client.channel());
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  auto context = client.NewContext(timeout);
  grpc::Status status = stub.Check(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

absl::Status WaitUntilServing(const RpcClient& client, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::DeadlineExceededError("not checked");
  while (absl::Now() < deadline) {
    auto health = CheckHealth(client, std::min(absl::Seconds(1), deadline - absl::Now()));
    if (health.ok() && *health == "SERVING") return absl::OkStatus();
    last = health.ok() ? absl::UnavailableError(absl::StrCat("health: ", *health)) : health.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(client.address(), " not serving after ", absl::FormatDuration(timeout), ": ",
                   last.message()));
}

}  // namespace rlmesh
