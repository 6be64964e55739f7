#pragma once

// What the replay store's in-memory catalog keeps of a group: enough to
// select, filter and count groups without reading trajectory bodies. Plain
// values; instances in the catalog are immutable once published (shared as
// shared_ptr<const GroupSummary>), so any thread may read them.

#include <cstdint>
#include <string>
#include <vector>

namespace rlmesh::replay {

struct SampleInfo {
  double reward = 0;
  int64_t policy_version = 0;
  int32_t response_length = 0;
  int32_t finish_reason = 0;
};

struct GroupSummary {
  // Per-experiment arrival number (FIFO order).
  int64_t seq = 0;
  int64_t step = 0;
  std::string group_id;
  std::string prompt_id;
  // Serialized size of the group's trajectories, bytes.
  int64_t bytes = 0;
  std::vector<SampleInfo> samples;
  int64_t min_policy_version() const;
  // Every sample has the same reward.
  bool zero_variance() const;
  // Population variance of the samples' rewards.
  double reward_variance() const;
};

}  // namespace rlmesh::replay
