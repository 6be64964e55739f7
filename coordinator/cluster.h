#pragma once

// A local cluster: the role processes the coordinator starts as children,
// one log each, watched and restarted (on the same port) when they die.
// No gRPC service here; the Coordinator service and the CLI use it.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc_client.h"
#include "common/subprocess.h"
#include "coordinator/role_command.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

struct ClusterOptions {
  // Folder holding the role binaries as Bazel lays them out
  // (<bin_dir>/rollout/rollout_worker, ...).
  std::string bin_dir;
  // Run directory; logs go to <run_dir>/logs/<role>.log, ports to
  // <run_dir>/ports/<role>.port.
  std::string run_dir;
  // Address every role binds. Default loopback.
  std::string bind = "127.0.0.1";
  // Processes per role.
  int rollout_workers = 1;
  int reward_servers = 1;
  int learners = 1;
  // Token file passed to every role (empty = no auth).
  std::string auth_token_file;
  // Flags every role gets (the coordinator's --tls_* settings).
  std::vector<std::string> role_args;
  // Replay buffer RocksDB folder. Default <run_dir>/replay_buffer.
  std::string buffer_path;
  // How long a role may take to report its port and serve health.
  absl::Duration start_timeout = absl::Seconds(30);
  // Health probe period of the monitor; a dead role is restarted.
  absl::Duration monitor_period = absl::Milliseconds(500);
  // Restart roles that exit. Default true.
  bool restart_dead = true;
  // Tell each rollout worker where the replay buffer and its reward server
  // are (--replay_buffer, --reward_server) and give workers and learners
  // their --name. Default true.
  bool wire_roles = true;
  // Extra flags for every process of a role (e.g. --tokenizer, --threads).
  std::vector<std::string> rollout_args;
  // Tokenizer the rollout workers and reward servers were given ("char" or
  // a path); experiments must match it.
  std::string tokenizer = "char";
  std::vector<std::string> reward_args;
  std::vector<std::string> learner_args;
  // Environment servers (environment.launch: `coordinator run` starts one),
  // started before the rollout workers, with these extra flags. Default 0.
  int environment_servers = 0;
  std::vector<std::string> environment_args;
  // When set, every role records spans to <trace_dir>/<role name>.json
  // (--trace_file), written when it stops.
  std::string trace_dir;
  // GPU index of each process of a role, round robin (process i takes entry
  // i % size); empty = the role computes on the CPU. A listed process gets
  // CUDA_VISIBLE_DEVICES=<index> and --device=cuda. See GpuConfig.
  std::vector<int> learner_gpus;
  std::vector<int> rollout_gpus;
  std::vector<int> reward_gpus;
  // Allow processes of different roles on one GPU. Default false.
  bool colocate_gpus = false;
  // Each role's --cuda_memory_fraction (gpus.*_memory_fraction); 0 = none.
  double learner_memory_fraction = 0;
  double rollout_memory_fraction = 0;
  double reward_memory_fraction = 0;

  // Checks the role binaries and the GPU lists.
  absl::Status Validate() const;
  // The GPU lists alone: indices in range, no two processes of one role on
  // a GPU, different roles only with colocate_gpus; memory fractions in
  // [0, 1], only for roles with GPUs, summing to at most 1 on each GPU.
  // Errors name the field or both processes ("gpus: learner-0 and
  // rollout-0 would share GPU 0").
  absl::Status ValidateGpus() const;
};

// Builds options from a ClusterConfig (proto, loaded from YAML).
ClusterOptions ClusterOptionsFromConfig(const ClusterConfig& config, const std::string& bin_dir,
                                        const std::string& run_dir);

// Thread-safe.
class Cluster {
 public:
  // Starts every role (replay buffer and reward servers first, then rollout
  // workers, then learners), waits until each serves health. On failure,
  // stops what was started and returns an error naming the role and its log.
  static absl::StatusOr<std::unique_ptr<Cluster>> Launch(ClusterOptions options);
  ~Cluster();

  // Every role with its current health (probed now, in parallel-free order).
  std::vector<RoleInfo> Roles();
  // Address of the i-th process of a role ("" if none).
  std::string Address(Role role, int index = 0);
  // Addresses of every process of a role, in index order.
  std::vector<std::string> Addresses(Role role);
  // Sends SIGTERM to all, waits up to `grace`, kills the rest. Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(5));
  const ClusterOptions& options() const { return options_; }
  // The roles' bearer token (from auth_token_file; "" = none). Set at Launch.
  const std::string& token() const { return token_; }

 private:
  struct Member {
    std::string name;
    Role role;
    std::vector<std::string> extra_args;
    // CUDA device index the process is given, or -1 (CPU).
    int gpu = -1;
    int port = 0;
    int restarts = 0;
    std::unique_ptr<Subprocess> process;
    std::unique_ptr<RpcClient> client;
  };

  explicit Cluster(ClusterOptions options) : options_(std::move(options)) {}
  absl::Status StartMember(Member* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string AddressLocked(Role role, int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Monitor();

  const ClusterOptions options_;
  std::string token_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Member>> members_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};
  std::thread monitor_;
};

// The GPU process `index` of `role` gets under `options` (round robin over
// the role's list), or -1 for the CPU.
int GpuOf(const ClusterOptions& options, Role role, int index);

}  // namespace rlmesh
