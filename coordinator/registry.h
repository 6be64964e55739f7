#pragma once

// The roles that registered themselves with the coordinator (placed by Slurm
// or by hand), their liveness from heartbeats, and their addresses for the
// launcher that waits on them. No gRPC here: CoordinatorServiceImpl adapts
// Register/Heartbeat onto it and tests drive it with a fake clock.
//
// Liveness: a role is "SERVING" from Register until no heartbeat has arrived
// for `heartbeat_timeout`, then "DEAD" (checked on every read, so a dead role
// is seen within the timeout plus the caller's polling period). A role that
// registers again under the same name counts one restart.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

struct RegistryOptions {
  // Period the roles are told to heartbeat at. Default 1 s.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A role without a heartbeat for this long is DEAD. Default 5 s; must be
  // longer than heartbeat_interval.
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // Most roles held (a bound on memory for a misbehaving client). Default 1024.
  int max_roles = 1024;
  // Time source; tests inject a fake. Default absl::Now.
  std::function<absl::Time()> clock = [] { return absl::Now(); };

  absl::Status Validate() const;
};

// Checks a Register request's RoleInfo; INVALID_ARGUMENT names the field.
// Accepted: name of 1-64 chars [A-Za-z0-9_.-] starting alphanumeric and
// without ".."; role one of rollout worker, reward server, replay buffer,
// learner; address "host:port" with a non-wildcard host of at most 253
// chars [A-Za-z0-9.-:[]] and a port in 1..65535; host (optional) like the
// address host; at most 32 capabilities of 1-64 chars [A-Za-z0-9_.=-].
absl::Status ValidateRoleInfo(const RoleInfo& info);

// Safe for concurrent use: every method takes mu_ for its whole body and none
// blocks on I/O while holding it (WaitFor waits on a condition of mu_).
class Registry {
 public:
  explicit Registry(RegistryOptions options = {});

  // Validates and records `info` (health SERVING, heartbeat now). A name seen
  // before keeps its record and counts a restart.
  absl::Status Register(const RoleInfo& info);

  // Records a heartbeat; false when the name is unknown (the role should
  // Register again). A DEAD role that heartbeats again is SERVING again.
  bool Heartbeat(const std::string& name);

  // Every role, sorted by name, with health computed against the clock now.
  std::vector<RoleInfo> Roles() const;

  // Times `name` has registered (0 if never).
  int Registrations(const std::string& name) const;

  // The role `name` once it has registered more than `after` times, or
  // DEADLINE_EXCEEDED after `timeout` (real time, not the injected clock).
  absl::StatusOr<RoleInfo> WaitFor(const std::string& name, int after, absl::Duration timeout) const;

  // Forgets a role (a launcher that stopped it for good).
  void Remove(const std::string& name);

  const RegistryOptions& options() const { return options_; }

 private:
  struct Entry {
    RoleInfo info;
    int registrations = 0;
    absl::Time last_heartbeat;
  };
  RoleInfo Snapshot(const Entry& e, absl::Time now) const;

  // Constant after construction.
  const RegistryOptions options_;
  // Guarded by mu_.
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> roles_ ABSL_GUARDED_BY(mu_);
  // Signalled on every Register (WaitFor waits on it).
  mutable absl::CondVar registered_;
};

}  // namespace rlmesh
