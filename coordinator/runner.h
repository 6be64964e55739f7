#pragma once

// Drives one experiment through its stages over the roles' RPCs:
//   sample prompts -> rollout workers (pipeline: reward -> replay buffer)
//   -> learner steps (pulling from the buffer) -> weight sync -> eval.
// The coordinator is control plane only: trajectories flow rollout ->
// reward -> buffer -> learner; only eval completions come back here.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc_client.h"
#include "proto/config.pb.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

struct RunnerOptions {
  // The experiment, normalised (NormalizeExperiment).
  ExperimentConfig experiment;
  // Unique id (also the replay buffer's experiment id).
  std::string experiment_id;
  // Run directory: metrics.jsonl, checkpoints/, weights/.
  std::string run_dir;
  // Role addresses.
  std::string replay_buffer;
  std::vector<std::string> reward_servers;
  std::vector<std::string> rollout_workers;
  std::vector<std::string> learners;
  // Token every RPC carries (empty = none).
  std::string auth_token;
  // Host of learner 0 as the rollout workers reach it: the weight-sync
  // group's c10d store (Gloo/NCCL backends) runs there
  // (Learner.HostWeightSyncStore).
  std::string sync_store_host = "127.0.0.1";
  // Print a progress line and the final summary to stdout.
  bool progress = true;
  // Continue a run in an existing run_dir: finished stages are skipped
  // (their markers hold the checkpoint they ended with), the stage in
  // progress resumes from its learners' newest checkpoint, and rollout
  // rounds keep counting from where they were (trajectory ids stay unique).
  bool resume = false;

  absl::Status Validate() const;
};

// Summary of a finished (or failed) run.
struct RunSummary {
  // Held-out greedy accuracy before the first stage and after each stage
  // (stage name -> accuracy), in order.
  std::vector<std::pair<std::string, double>> accuracy;
  double seconds = 0;
};

// Run() is called once, from one thread; status() from any.
class ExperimentRunner {
 public:
  explicit ExperimentRunner(RunnerOptions options);
  ~ExperimentRunner();

  // Runs every stage; returns when done, failed or cancelled (CANCELLED).
  absl::Status Run();
  // Asks Run() to stop at the next step boundary.
  void Cancel() { cancelled_.store(true); }
  // A snapshot for `coordinator status`.
  ExperimentStatus status() const;
  RunSummary summary() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace rlmesh
