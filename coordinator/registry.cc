#include "coordinator/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/log.h"

namespace rlmesh {
namespace {

bool AllOf(const std::string& s, const char* extra) {
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string(extra).find(c) != std::string::npos;
  });
}

absl::Status ValidateHost(const std::string& field, const std::string& host) {
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": empty host"));
  if (host.size() > 253) return absl::InvalidArgumentError(absl::StrCat(field, ": host longer than 253 chars"));
  if (!AllOf(host, ".-:[]_")) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": host has characters outside [A-Za-z0-9.-:[]_]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RegistryOptions::Validate() const {
  if (heartbeat_interval <= absl::ZeroDuration()) return absl::InvalidArgumentError("heartbeat_interval: not positive");
  if (heartbeat_timeout <= heartbeat_interval) {
    return absl::InvalidArgumentError("heartbeat_timeout: must be longer than heartbeat_interval");
  }
  if (max_roles <= 0) return absl::InvalidArgumentError("max_roles: not positive");
  if (!clock) return absl::InvalidArgumentError("clock: unset");
  return absl::OkStatus();
}

absl::Status ValidateRoleInfo(const RoleInfo& info) {
  const std::string& name = info.name();
  if (name.empty()) return absl::InvalidArgumentError("role.name: empty");
  if (name.size() > 64) return absl::InvalidArgumentError(absl::StrCat("role.name: ", name.size(), " chars, at most 64"));
  if (!AllOf(name, "_.-") || !AllOf(name.substr(0, 1), "") || absl::StrContains(name, "..")) {
    return absl::InvalidArgumentError(
        "role.name: must be [A-Za-z0-9][A-Za-z0-9_.-]* without '..' (it names log and state files)");
  }
  switch (info.role()) {
    case ROLE_ROLLOUT_WORKER:
    case ROLE_REWARD_SERVER:
    case ROLE_REPLAY_BUFFER:
    case ROLE_LEARNER:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "role.role: ", info.role(), " is not rollout worker, reward server, replay buffer or learner"));
  }
  const std::string& address = info.address();
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("role.address: '", address.substr(0, 64), "' is not host:port"));
  }
  const std::string host = address.substr(0, colon);
  if (auto s = ValidateHost("role.address", host); !s.ok()) return s;
  if (host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::InvalidArgumentError("role.address: wildcard host; advertise an address others can reach");
  }
  const std::string port = address.substr(colon + 1);
  int p = 0;
  if (port.empty() || port.size() > 5 || !AllOf(port, "") ||
      std::any_of(port.begin(), port.end(), [](char c) { return c < '0' || c > '9'; }) ||
      (p = std::stoi(port)) < 1 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("role.address: port '", port.substr(0, 8), "' not in 1..65535"));
  }
  if (!info.host().empty()) {
    if (auto s = ValidateHost("role.host", info.host()); !s.ok()) return s;
  }
  if (info.capabilities_size() > 32) return absl::InvalidArgumentError("role.capabilities: more than 32");
  for (const auto& c : info.capabilities()) {
    if (c.empty() || c.size() > 64 || !AllOf(c, "_.=-")) {
      return absl::InvalidArgumentError("role.capabilities: each must be 1-64 chars of [A-Za-z0-9_.=-]");
    }
  }
  return absl::OkStatus();
}

Registry::Registry(RegistryOptions options) : options_(std::move(options)) {}

absl::Status Registry::Register(const RoleInfo& info) {
  if (auto s = ValidateRoleInfo(info); !s.ok()) return s;
  const absl::Time now = options_.clock();
  absl::MutexLock lock(&mu_);
  auto it = roles_.find(info.name());
  if (it == roles_.end() && static_cast<int>(roles_.size()) >= options_.max_roles) {
    return absl::ResourceExhaustedError(absl::StrCat("registry full (", options_.max_roles, " roles)"));
  }
  Entry& e = roles_[info.name()];
  if (e.registrations > 0 && e.info.role() != info.role()) {
    return absl::AlreadyExistsError(absl::StrCat("role.name: '", info.name(), "' is registered with another role"));
  }
  const int restarts = e.registrations > 0 ? e.info.restarts() + 1 : 0;
  e.info = info;
  e.info.set_restarts(restarts);
  e.info.clear_health();
  e.info.clear_last_heartbeat_unix_micros();
  e.registrations++;
  e.last_heartbeat = now;
  registered_.SignalAll();
  RLMESH_LOG(INFO) << "registered role=" << info.name() << " address=" << info.address() << " host=" << info.host()
                   << " restarts=" << restarts;
  return absl::OkStatus();
}

bool Registry::Heartbeat(const std::string& name) {
  const absl::Time now = options_.clock();
  absl::MutexLock lock(&mu_);
  auto it = roles_.find(name);
  if (it == roles_.end()) return false;
  it->second.last_heartbeat = now;
  return true;
}

RoleInfo Registry::Snapshot(const Entry& e, absl::Time now) const {
  RoleInfo info = e.info;
  info.set_last_heartbeat_unix_micros(absl::ToUnixMicros(e.last_heartbeat));
  info.set_health(now - e.last_heartbeat > options_.heartbeat_timeout ? "DEAD" : "SERVING");
  return info;
}

std::vector<RoleInfo> Registry::Roles() const {
  const absl::Time now = options_.clock();
  absl::MutexLock lock(&mu_);
  std::vector<RoleInfo> out;
  for (const auto& [name, e] : roles_) out.push_back(Snapshot(e, now));
  return out;
}

int Registry::Registrations(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = roles_.find(name);
  return it == roles_.end() ? 0 : it->second.registrations;
}

absl::StatusOr<RoleInfo> Registry::WaitFor(const std::string& name, int after, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = roles_.find(name);
    if (it != roles_.end() && it->second.registrations > after) return Snapshot(it->second, options_.clock());
    if (registered_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(name, " did not register with the coordinator within ", absl::FormatDuration(timeout)));
    }
  }
}

void Registry::Remove(const std::string& name) {
  absl::MutexLock lock(&mu_);
  roles_.erase(name);
}

}  // namespace rlmesh
