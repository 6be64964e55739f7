#pragma once

// One training step's metrics from every learner rank, merged into the row
// the coordinator logs.
//
// Each rank reports its own: means over its share of the batch (loss,
// reward_mean, clip_frac, ...), counts of what it trained (tokens, groups,
// pairs), extremes (ratio_max), its timings, and values every rank computes
// from the whole batch (grad_norm, lr). Only the data-parallel replicas
// count: the ranks of one tensor-parallel replica train the same rows and
// report the same values, so the merge reads ranks 0, tp, 2*tp, ...
//
// - means (any key not named below): averaged over the replicas, unweighted,
//   as TRL and verl reduce theirs. Exact when the replicas' shares weigh
//   the same (equal rows or pairs, the usual split); otherwise a mean of
//   means;
// - counts and throughput (tokens, groups, pairs, rows, loss_tokens,
//   tokens_per_second): summed;
// - `*_max`, and the learner's `seconds_*` (a synchronous step lasts as long
//   as its slowest rank): the largest; `*_min`: the smallest;
// - whole-batch values (grad_norm, value_grad_norm, lr, skipped,
//   optimizer_steps, old_logprobs_recomputed): rank 0's.
// A key some replicas lack (a rank with nothing to train) is merged over
// those that have it.

#include <vector>

#include "proto/learner.pb.h"

namespace rlmesh {

// REQUIRES: !ranks.empty(); tp >= 1 (values below 1 read as 1).
StepMetrics MergeStepMetrics(const std::vector<StepMetrics>& ranks, int tp);

}  // namespace rlmesh
