#include "common/registration.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "proto/coordinator.grpc.pb.h"

namespace rlmesh {
namespace {

bool IsWildcard(const std::string& host) { return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]"; }

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

// The source address the kernel would pick to reach `host` (a connected UDP
// socket sends nothing).
absl::StatusOr<std::string> RouteTo(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0 || res == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string out;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN] = {0};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr) {
      out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  if (out.empty()) return absl::UnavailableError(absl::StrCat("no route to ", host));
  return out;
}

}  // namespace

absl::StatusOr<std::string> InterfaceAddress(const std::string& interface) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return absl::InternalError("getifaddrs failed");
  std::string out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || interface != a->ifa_name) continue;
    char buf[INET_ADDRSTRLEN] = {0};
    if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof(buf))) {
      out = buf;
      break;
    }
  }
  ::freeifaddrs(list);
  if (out.empty()) return absl::NotFoundError(absl::StrCat("interface '", interface, "' has no IPv4 address"));
  return out;
}

absl::StatusOr<std::string> AdvertisedAddress(const std::string& advertise_address,
                                              const std::string& advertise_interface, const std::string& bind,
                                              int port, const std::string& coordinator) {
  if (!advertise_address.empty()) {
    const bool has_port = advertise_address.find(':') != std::string::npos && advertise_address.back() != ']';
    return has_port ? advertise_address : absl::StrCat(advertise_address, ":", port);
  }
  if (!advertise_interface.empty()) {
    auto ip = InterfaceAddress(advertise_interface);
    if (!ip.ok()) return ip.status();
    return absl::StrCat(*ip, ":", port);
  }
  if (!IsWildcard(bind)) return absl::StrCat(bind, ":", port);
  if (!coordinator.empty()) {
    auto ip = RouteTo(HostOf(coordinator));
    if (ip.ok()) return absl::StrCat(*ip, ":", port);
  }
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) return absl::InternalError("gethostname failed");
  return absl::StrCat(host, ":", port);
}

absl::Status RegistrationOptions::Validate() const {
  if (coordinator.empty()) return absl::InvalidArgumentError("coordinator: empty");
  if (role.name().empty()) return absl::InvalidArgumentError("role.name: empty");
  if (role.address().empty()) return absl::InvalidArgumentError("role.address: empty");
  if (rpc_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("rpc_timeout: not positive");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Registration>> Registration::Start(RegistrationOptions options) {
  if (auto s = options.Validate(); !s.ok()) return s;
  ClientOptions copts;
  copts.auth_token = options.auth_token;
  copts.default_timeout = options.rpc_timeout;
  auto client = RpcClient::Create(options.coordinator, copts);
  if (!client.ok()) return client.status();
  std::unique_ptr<Registration> r(new Registration(std::move(options), std::move(*client)));
  r->thread_ = std::thread([p = r.get()] { p->Loop(); });
  return r;
}

Registration::~Registration() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool Registration::Sleep(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
  return !stopping_;
}

void Registration::Loop() {
  auto stub = Coordinator::NewStub(client_.channel());
  const std::string& name = options_.role.name();
  int failures = 0;
  bool registered = false;
  absl::Duration interval = absl::Seconds(1);
  while (true) {
    if (!registered) {
      RegisterRequest req;
      *req.mutable_role() = options_.role;
      RegisterResponse resp;
      auto ctx = client_.NewContext();
      absl::Status s = FromGrpcStatus(stub->Register(ctx.get(), req, &resp));
      if (s.ok()) {
        registered = true;
        failures = 0;
        if (resp.heartbeat_interval_seconds() > 0) interval = absl::Seconds(resp.heartbeat_interval_seconds());
        RLMESH_LOG(INFO) << "registered role=" << name << " address=" << options_.role.address()
                         << " coordinator=" << options_.coordinator;
      } else if (s.code() == absl::StatusCode::kInvalidArgument) {
        // The same request will not succeed later: say so once and stop.
        RLMESH_LOG(ERROR) << "coordinator=" << options_.coordinator << " refused registration of role=" << name
                          << ": " << s.message();
        return;
      } else if (failures++ % 10 == 0) {
        RLMESH_LOG(WARNING) << "register role=" << name << " coordinator=" << options_.coordinator
                            << " failed (attempt " << failures << "): " << s.message();
      }
      if (!Sleep(registered ? interval : options_.retry_period)) return;
      continue;
    }
    HeartbeatRequest req;
    req.set_name(name);
    HeartbeatResponse resp;
    auto ctx = client_.NewContext();
    absl::Status s = FromGrpcStatus(stub->Heartbeat(ctx.get(), req, &resp));
    if (s.ok() && !resp.known()) {
      RLMESH_LOG(WARNING) << "coordinator=" << options_.coordinator << " forgot role=" << name << "; registering again";
      registered = false;
      continue;
    }
    if (!s.ok() && failures++ % 10 == 0) {
      RLMESH_LOG(WARNING) << "heartbeat role=" << name << " coordinator=" << options_.coordinator
                          << " failed: " << s.message();
    }
    if (s.ok()) failures = 0;
    if (!Sleep(interval)) return;
  }
}

}  // namespace rlmesh
