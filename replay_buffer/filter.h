#pragma once

// TrajectoryFilter (Query, Export): validation and the per-sample match on
// the catalog's summaries. Pure functions.

#include "absl/status/status.h"
#include "proto/replay_buffer.pb.h"
#include "replay_buffer/group_summary.h"

namespace rlmesh::replay {

// INVALID_ARGUMENT naming the field ("filter.max_step is below filter.min_step").
absl::Status ValidateFilter(const TrajectoryFilter& f);
// Whether a sample passes the filter's version, reward and finish-reason
// conditions (the step, prompt and text conditions are the caller's).
bool SampleMatches(const TrajectoryFilter& f, const SampleInfo& s);

}  // namespace rlmesh::replay
