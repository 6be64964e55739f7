#pragma once

// The replay store both replay buffer fuzz targets run against: opened once
// per process in a temporary folder (removed at exit) and seeded with
// experiment "seed" (4 groups of 2 samples), so Query, Sample, Ack, Trim
// and Export reach real data. The targets keep "seed" intact and check
// after every input that all 8 of its trajectories are still there.

#include "replay_buffer/store.h"

namespace rlmesh::fuzz {

// Trajectories of the seeded experiment "seed".
inline constexpr int kSeedTrajectories = 8;

// The process's seeded store; aborts if it cannot be made. Never freed.
ReplayStore* SeededReplayStore();

// "" when experiment "seed" still holds its 8 trajectories, else why not.
std::string CheckSeed(ReplayStore& store);

}  // namespace rlmesh::fuzz
