#pragma once

// DAPO dynamic sampling with refill, the coordinator's part: which groups
// count (nonzero reward variance) and how many prompts the next refill
// round asks for. The loop that uses them is RunLoop::GenerateStep
// (generation.cc); the learner keeps the informative groups
// (learner/batching.h, KeepInformativeGroups). Plain functions.

#include <cstdint>
#include <vector>

#include "proto/common.pb.h"

namespace rlmesh {

// True when the group's rewards are not all equal (a group of one sample
// never varies).
bool RewardVaries(const TrajectoryGroup& group);

// Groups among `groups` whose rewards vary.
int CountInformative(const std::vector<TrajectoryGroup>& groups);

// Prompts for the next refill round, given `wanted` informative groups per
// step, `generated` groups so far of which `informative` vary, `available`
// unused prompts and `shards` learner shards:
//   deficit = wanted - informative (0 -> 0: nothing to do)
//   n = ceil(deficit * generated / informative)  (the expected need at the
//       rate seen so far), or `wanted` while no group has varied
//   n is clamped to [deficit, wanted], rounded up to a multiple of
//   `shards` (the learner splits the step's groups evenly), and cut down to
//   a multiple of `shards` that fits in `available` (0 = stop).
// REQUIRES: wanted, shards >= 1; generated >= informative >= 0.
int RefillRoundSize(int wanted, int generated, int informative, int64_t available, int shards);

}  // namespace rlmesh
