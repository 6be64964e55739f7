#include "replay_buffer/group_summary.h"

#include <algorithm>

namespace rlmesh::replay {

int64_t GroupSummary::min_policy_version() const {
  int64_t v = samples.empty() ? 0 : samples[0].policy_version;
  for (const auto& s : samples) v = std::min(v, s.policy_version);
  return v;
}

bool GroupSummary::zero_variance() const {
  for (const auto& s : samples) {
    if (s.reward != samples[0].reward) return false;
  }
  return true;
}

double GroupSummary::reward_variance() const {
  if (samples.empty()) return 0;
  double mean = 0;
  for (const auto& s : samples) mean += s.reward;
  mean /= samples.size();
  double var = 0;
  for (const auto& s : samples) var += (s.reward - mean) * (s.reward - mean);
  return var / samples.size();
}

}  // namespace rlmesh::replay
