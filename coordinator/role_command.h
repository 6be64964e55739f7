#pragma once

// The command line of one role process, shared by every launcher that
// places roles on other hosts (Slurm steps, Kubernetes pods): which binary,
// where it serves, how it finds and registers with the coordinator. No gRPC
// here; the Kubernetes renderer links it without the RPC stack.

#include <string>
#include <vector>

#include "proto/coordinator.pb.h"

namespace rlmesh {

// The role binary path for a role under bin_dir
// (<bin_dir>/learner/learner, ...); "" for ROLE_UNSPECIFIED.
std::string RoleBinary(const std::string& bin_dir, Role role);

// One role process, as the launcher wants it started. Plain data.
struct RoleCommand {
  // Folder with the role binaries (RoleBinary).
  std::string bin_dir;
  Role role = ROLE_UNSPECIFIED;
  // --port; 0 = any free one (the role registers what it bound).
  int port = 0;
  // --bind: the address it serves on. Default every interface.
  std::string bind = "0.0.0.0";
  // --coordinator: host:port it registers and heartbeats at. Required.
  std::string coordinator;
  // --instance_name: the name it registers under ("learner-0").
  std::string instance_name;
  // --advertise_interface / --advertise_address (either may be empty): the
  // address others dial it at. Empty both = the address that routes to
  // the coordinator.
  std::string advertise_interface;
  std::string advertise_address;
  // --auth_token_file; empty = no auth.
  std::string auth_token_file;
  // Flags every role gets (the --tls_* settings), then this role's own
  // (--db_path, --tokenizer, --name), then its wiring (--replay_buffer=...).
  std::vector<std::string> common_args;
  std::vector<std::string> role_args;
  std::vector<std::string> wiring;
};

// argv of `command`: the binary, then its flags in the order above.
std::vector<std::string> RoleArgv(const RoleCommand& command);

}  // namespace rlmesh
