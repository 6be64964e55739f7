#include "coordinator/dynamic_sampling.h"

#include <algorithm>

namespace rlmesh {

bool RewardVaries(const TrajectoryGroup& group) {
  for (int i = 1; i < group.samples_size(); ++i) {
    if (group.samples(i).reward() != group.samples(0).reward()) return true;
  }
  return false;
}

int CountInformative(const std::vector<TrajectoryGroup>& groups) {
  int n = 0;
  for (const TrajectoryGroup& g : groups) n += RewardVaries(g) ? 1 : 0;
  return n;
}

int RefillRoundSize(int wanted, int generated, int informative, int64_t available, int shards) {
  const int deficit = wanted - informative;
  if (deficit <= 0) return 0;
  int64_t n = wanted;
  if (informative > 0) {
    n = (static_cast<int64_t>(deficit) * generated + informative - 1) / informative;
  }
  n = std::clamp<int64_t>(n, deficit, wanted);
  n = (n + shards - 1) / shards * shards;
  if (n > available) n = available / shards * shards;
  return static_cast<int>(n);
}

}  // namespace rlmesh
