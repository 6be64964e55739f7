#pragma once

// The roles of a cluster as Slurm job steps: one sbatch allocation that only
// holds the nodes, and one `srun --jobid` step per role started by the
// coordinator into it. Roles register with the coordinator (--coordinator)
// and are found through the Registry, not through port files, so nothing but
// the binaries (and the tokenizer, if any) has to be on a shared filesystem;
// each step's output is forwarded by its srun into <run_dir>/logs/<name>.log
// on the coordinator's host.
//
// A step that ends while the cluster runs (the role crashed, a node lost it,
// or someone ran `scancel JOB.STEP`) is started again as a new step on the
// same node and port, so its address is unchanged and the experiment runner
// recovers as it does for a local role. Stop() cancels the job (scancel).

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "coordinator/cluster.h"
#include "coordinator/registry.h"
#include "proto/config.pb.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

struct SlurmOptions {
  // The roles and their flags, as for a local cluster (bin_dir, run_dir,
  // process counts, auth token file, buffer path, per-role args, tokenizer).
  // bin_dir must hold the same binaries at the same path on every node.
  ClusterOptions cluster;
  // Name of the allocation (sbatch --job-name). Default "rlmesh".
  std::string job_name = "rlmesh";
  // sbatch --partition; empty = the default partition.
  std::string partition;
  // sbatch --nodes; 0 = one more than the highest node index used.
  int nodes = 0;
  // sbatch --time; empty = the partition's default.
  std::string time_limit;
  // Extra sbatch arguments.
  std::vector<std::string> sbatch_args;
  // Node index within the allocation (srun --relative) per process of each
  // role, round robin; empty = node 0.
  std::vector<int> replay_buffer_nodes;
  std::vector<int> reward_server_nodes;
  std::vector<int> rollout_worker_nodes;
  std::vector<int> learner_nodes;
  // host:port the roles Register at. Required; not loopback or wildcard.
  std::string coordinator_address;
  // Interface the roles advertise and Gloo uses (GLOO_SOCKET_IFNAME); empty =
  // the address that routes to the coordinator.
  std::string network_interface;
  // How long a role's step may take to Register. Default 60 s.
  absl::Duration start_timeout = absl::Seconds(60);
  // How long the allocation may stay pending before Launch gives up and
  // cancels it. Default 10 min.
  absl::Duration queue_timeout = absl::Minutes(10);
  // How often the monitor checks the steps. Default 500 ms.
  absl::Duration monitor_period = absl::Milliseconds(500);
  // Slurm commands (a test may point these at wrappers).
  std::string sbatch = "sbatch";
  std::string srun = "srun";
  std::string scancel = "scancel";
  std::string squeue = "squeue";

  absl::Status Validate() const;
};

// Builds SlurmOptions from a cluster's options and its `slurm:` section.
SlurmOptions SlurmOptionsFromConfig(const ClusterOptions& cluster, const SlurmConfig& slurm,
                                    const std::string& job_name);

// One role process as a step.
struct SlurmStep {
  std::string name;  // "replay_buffer", "reward-0", "rollout-1", "learner-0"
  Role role = ROLE_UNSPECIFIED;
  int node = 0;  // srun --relative
  std::vector<std::string> role_args;  // flags after the binary, without wiring
};

// Every step in start order: replay buffer, reward servers, rollout workers,
// learners.
std::vector<SlurmStep> PlanSteps(const SlurmOptions& options);

// The sbatch script: #SBATCH lines for the allocation, then a body that
// holds it until cancelled. The steps the coordinator will start are listed
// in comments (StepCommand with the wiring shown as placeholders).
std::string BatchScript(const SlurmOptions& options);

// argv of the srun that runs `step` in job `job_id` on port `port` (0 = any),
// with `wiring` (e.g. --replay_buffer=H:P) appended.
std::vector<std::string> StepCommand(const SlurmOptions& options, const std::string& job_id, const SlurmStep& step,
                                     int port, const std::vector<std::string>& wiring);

// Safe for concurrent use.
class SlurmCluster {
 public:
  // Submits the allocation, waits until it runs, starts every step and waits
  // for each role to register with `registry` (which the coordinator's RPC
  // server must already be serving). On failure cancels the job and returns
  // an error naming the role and its log.
  static absl::StatusOr<std::unique_ptr<SlurmCluster>> Launch(SlurmOptions options, Registry* registry);
  ~SlurmCluster();

  // Registered address of every process of a role, in index order.
  std::vector<std::string> Addresses(Role role);
  std::string job_id() const { return job_id_; }
  // Cancels the job (scancel), waits up to `grace` for the srun processes,
  // kills the rest. Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(10));

 private:
  struct Member {
    SlurmStep step;
    std::vector<std::string> wiring;
    std::string address;  // as registered
    int port = 0;
    int restarts = 0;
    std::unique_ptr<Subprocess> srun;
  };
  SlurmCluster(SlurmOptions options, Registry* registry, std::string job_id)
      : options_(std::move(options)), registry_(registry), job_id_(std::move(job_id)) {}
  absl::Status StartMember(Member* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Monitor();

  // Constant after construction.
  const SlurmOptions options_;
  Registry* const registry_;
  const std::string job_id_;
  // Guarded by mu_.
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Member>> members_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};
  std::thread monitor_;
};

// FAILED_PRECONDITION when `backend` is WEIGHT_SYNC_SHM and a rollout worker
// registered from another host than learner-0 (shared memory does not cross
// hosts); the error names both roles and their hosts. OK otherwise (AUTO
// picks Gloo across hosts by itself).
absl::Status CheckWeightSyncPlacement(WeightSyncBackend backend, const std::vector<RoleInfo>& roles);

// Runs `argv` (argv[0] a path or a name on $PATH, stdin /dev/null) to the
// end and returns its stdout (up to 1 MiB); UNAVAILABLE with its stderr (or
// stdout) when it fails, DEADLINE_EXCEEDED when it runs past `timeout` (its
// process group is killed), Subprocess::Spawn's error when it cannot start.
absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv, absl::Duration timeout);

}  // namespace rlmesh
