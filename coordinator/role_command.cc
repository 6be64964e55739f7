#include "coordinator/role_command.h"

#include "absl/strings/str_cat.h"

namespace rlmesh {

std::string RoleBinary(const std::string& bin_dir, Role role) {
  switch (role) {
    case ROLE_ROLLOUT_WORKER: return bin_dir + "/rollout/rollout_worker";
    case ROLE_REWARD_SERVER: return bin_dir + "/reward_server/reward_server";
    case ROLE_REPLAY_BUFFER: return bin_dir + "/replay_buffer/replay_buffer";
    case ROLE_LEARNER: return bin_dir + "/learner/learner";
    case ROLE_ENVIRONMENT: return bin_dir + "/environment/environment_server";
    case ROLE_COORDINATOR: return bin_dir + "/coordinator/coordinator";
    default: return "";
  }
}

std::vector<std::string> RoleArgv(const RoleCommand& c) {
  std::vector<std::string> argv = {RoleBinary(c.bin_dir, c.role), absl::StrCat("--port=", c.port), "--bind=" + c.bind,
                                   "--coordinator=" + c.coordinator, "--instance_name=" + c.instance_name};
  if (!c.advertise_interface.empty()) argv.push_back("--advertise_interface=" + c.advertise_interface);
  if (!c.advertise_address.empty()) argv.push_back("--advertise_address=" + c.advertise_address);
  if (!c.auth_token_file.empty()) argv.push_back("--auth_token_file=" + c.auth_token_file);
  for (const auto* list : {&c.common_args, &c.role_args, &c.wiring}) {
    argv.insert(argv.end(), list->begin(), list->end());
  }
  return argv;
}

}  // namespace rlmesh
