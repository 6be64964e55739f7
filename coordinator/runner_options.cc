#include "coordinator/runner_options.h"

#include "absl/strings/str_cat.h"

namespace rlmesh {

absl::Status RunnerOptions::Validate() const {
  if (experiment_id.empty()) return absl::InvalidArgumentError("experiment_id: empty");
  if (run_dir.empty()) return absl::InvalidArgumentError("run_dir: empty");
  if (replay_buffer.empty()) return absl::InvalidArgumentError("replay_buffer: no address");
  if (reward_servers.empty()) return absl::InvalidArgumentError("reward_servers: none");
  if (rollout_workers.empty()) return absl::InvalidArgumentError("rollout_workers: none");
  if (learners.empty()) return absl::InvalidArgumentError("learners: none");
  if (resume && !evaluate_folder.empty()) return absl::InvalidArgumentError("evaluate_folder: not with resume");
  if (static_cast<int>(learners.size()) != experiment.learner().shards()) {
    return absl::InvalidArgumentError(absl::StrCat("learner.shards: the experiment wants ", experiment.learner().shards(),
                                                   " but the cluster has ", learners.size(), " learners"));
  }
  return absl::OkStatus();
}

}  // namespace rlmesh
