#include "replay_buffer/filter.h"

#include <cmath>

#include "common/status_macros.h"
#include "replay_buffer/format.h"

namespace rlmesh::replay {

bool SampleMatches(const TrajectoryFilter& f, const SampleInfo& s) {
  if (s.policy_version < f.min_policy_version()) return false;
  if (f.max_policy_version() > 0 && s.policy_version > f.max_policy_version()) return false;
  if (f.has_reward_range() && (s.reward < f.min_reward() || s.reward > f.max_reward())) {
    return false;
  }
  if (f.finish_reason() != FINISH_REASON_UNSPECIFIED && s.finish_reason != f.finish_reason()) {
    return false;
  }
  return true;
}

absl::Status ValidateFilter(const TrajectoryFilter& f) {
  RLMESH_RETURN_IF_ERROR(CheckId(f.experiment_id(), "filter.experiment_id", true));
  RLMESH_RETURN_IF_ERROR(CheckId(f.prompt_id(), "filter.prompt_id", false));
  if (f.min_step() < 0) return absl::InvalidArgumentError("filter.min_step is negative");
  if (f.max_step() < 0) return absl::InvalidArgumentError("filter.max_step is negative");
  if (f.max_step() > 0 && f.max_step() < f.min_step()) {
    return absl::InvalidArgumentError("filter.max_step is below filter.min_step");
  }
  if (f.max_policy_version() > 0 && f.max_policy_version() < f.min_policy_version()) {
    return absl::InvalidArgumentError("filter.max_policy_version is below filter.min_policy_version");
  }
  if (f.has_reward_range()) {
    if (!std::isfinite(f.min_reward()) || !std::isfinite(f.max_reward())) {
      return absl::InvalidArgumentError("filter.min_reward/max_reward must be finite");
    }
    if (f.max_reward() < f.min_reward()) {
      return absl::InvalidArgumentError("filter.max_reward is below filter.min_reward");
    }
  }
  if (!FinishReason_IsValid(f.finish_reason())) {
    return absl::InvalidArgumentError("filter.finish_reason is not a known value");
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::replay
