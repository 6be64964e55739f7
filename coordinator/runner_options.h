#pragma once

// What an ExperimentRunner is asked to do, and what it reports at the end.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "proto/config.pb.h"

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
  // Host of learner 0 as the other learners and the rollout workers reach
  // it: the c10d store of the learner group and of the weight-sync group
  // (Gloo/NCCL backends) runs there (Learner.HostStore).
  std::string sync_store_host = "127.0.0.1";
  // Print a progress line and the final summary to stdout.
  bool progress = true;
  // Continue a run in an existing run_dir: finished stages are skipped
  // (their markers hold the checkpoint they ended with), the stage in
  // progress resumes from its learners' newest checkpoint, and rollout
  // rounds keep counting from where they were (trajectory ids stay unique).
  bool resume = false;
  // `coordinator eval`: evaluate this model folder on the experiment's
  // held-out set and stop; no stage runs. Empty = run the stages.
  std::string evaluate_folder;
  // Where evaluate_folder's per-sample JSONL goes; empty =
  // <run_dir>/eval_samples.jsonl.
  std::string eval_samples;

  absl::Status Validate() const;
};

// Summary of a finished (or failed) run.
struct RunSummary {
  // Held-out greedy accuracy before the first stage and after each stage
  // (stage name -> accuracy), in order.
  std::vector<std::pair<std::string, double>> accuracy;
  double seconds = 0;
};

}  // namespace rlmesh
