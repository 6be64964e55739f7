#pragma once

// The experiments a coordinator knows: submitted configs, each run by an
// ExperimentRunner on its own thread against the cluster's roles. One runs
// at a time (they share the roles); later submissions wait their turn.

#include <deque>
#include <map>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/runner.h"
#include "proto/config.pb.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

struct ClusterAddresses {
  std::string replay_buffer;
  std::vector<std::string> reward_servers;
  std::vector<std::string> rollout_workers;
  std::vector<std::string> learners;
  std::string auth_token;
  // Tokenizer of the rollout workers and reward servers.
  std::string tokenizer = "char";
  // Parent of every experiment's run directory.
  std::string run_root = "runs";
  // Host of learner 0 as the rollout workers reach it (weight-sync store).
  std::string sync_store_host = "127.0.0.1";
  // Programs the reward servers were started allowing as `command`
  // verifiers (resolved paths). Set for a launched cluster: a submitted
  // experiment naming another program is refused at Submit. Unset when the
  // servers were started for the experiment itself (`coordinator run`).
  std::optional<std::vector<std::string>> reward_commands;
  // Whether the cluster's roles, as placed, can run an experiment (e.g. the
  // shm weight-sync backend needs the learner and the workers on one host);
  // called at Submit, an error refuses the experiment. Null = no check.
  std::function<absl::Status(const ExperimentConfig&)> check_placement;
};

// The runner's options for `experiment` as `experiment_id` in `run_dir`,
// its roles `cluster`'s (addresses, auth token, weight-sync store host);
// every other field keeps its default.
RunnerOptions RunnerOptionsFor(ExperimentConfig experiment, std::string experiment_id, std::string run_dir,
                               const ClusterAddresses& cluster);

// Safe for concurrent use.
class ExperimentManager {
 public:
  explicit ExperimentManager(ClusterAddresses cluster);
  ~ExperimentManager();

  // Validates, assigns an id "<name>-<yyyymmdd-hhmmss>[-k]" and queues it.
  absl::StatusOr<std::string> Submit(ExperimentConfig config);
  absl::StatusOr<ExperimentStatus> Status(const std::string& id) const;
  // The newest experiment, if any.
  absl::StatusOr<ExperimentStatus> Newest() const;
  std::vector<ExperimentStatus> List() const;
  absl::StatusOr<std::string> Cancel(const std::string& id);
  // Cancels everything and joins the worker thread.
  void Shutdown();

 private:
  struct Entry {
    std::string id;
    ExperimentConfig config;
    std::unique_ptr<ExperimentRunner> runner;
    bool cancelled_before_start = false;
  };
  void Work();

  const ClusterAddresses cluster_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace rlmesh
