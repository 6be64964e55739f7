#pragma once

// The gRPC implementations of role_clients.h. Every call carries a deadline
// (the ones the runner always used: 10 min for Configure/Save, 30 min for a
// train step or a generation stream, ...) and the run's auth token. No
// retries here: a failed call goes back to the loop, whose recovery decides.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/role_clients.h"

namespace rlmesh {

struct RoleAddresses {
  std::string replay_buffer;
  std::vector<std::string> reward_servers;
  std::vector<std::string> rollout_workers;
  // Index = learner rank.
  std::vector<std::string> learners;
  // Token every RPC carries (empty = none).
  std::string auth_token;
};

// Lazily connecting channels to every role (no RPC is made here).
absl::StatusOr<RoleClients> ConnectRoles(const RoleAddresses& addresses);

}  // namespace rlmesh
