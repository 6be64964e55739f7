#pragma once

// One training step's metrics from every learner rank, merged into the row
// the coordinator logs.
//
// Each rank reports its own: means over its share of the batch (loss,
// reward_mean, clip_frac, ...), counts of what it trained (tokens, groups,
// pairs), extremes (ratio_max), its timings, and values every rank computes
// from the whole batch (grad_norm, lr). Only the data-parallel replicas
// count: the ranks of one replica (its tensor-parallel ranks and pipeline
// stages) train the same rows and report the same values, so the merge
// reads ranks 0, n, 2*n, ... for n ranks per replica (tp x pp x cp).
//
// - means (any key not named below): averaged over the replicas, weighted
//   by each replica's `mean_weight`, the weight its means are over (the
//   loss units of the step: SFT's target tokens, DPO's and the reward
//   model's pairs, RL's loss-mask weight over its micro-batches and
//   epochs). The loss and every other metric the learner averages over its
//   micro-batches then equal one process's on the whole batch (up to
//   summation order), and a replica that trained nothing (weight 0) does
//   not pull them toward its zeros. Without a mean_weight from every
//   replica: unweighted, a mean of means;
// - counts and throughput (tokens, groups, pairs, rows, loss_tokens,
//   tokens_per_second, mean_weight): summed;
// - `*_max`, and the learner's `seconds_*` (a synchronous step lasts as long
//   as its slowest rank): the largest; `*_min`: the smallest;
// - whole-batch values (grad_norm, value_grad_norm, lr, skipped,
//   optimizer_steps, old_logprobs_recomputed): rank 0's.
// A key some replicas lack (a rank with nothing to train) is merged over
// those that have it.

#include <vector>

#include "proto/learner.pb.h"

namespace rlmesh {

// `tp`: ranks per replica (learner.tp x learner.pp x learner.cp). REQUIRES:
// !ranks.empty(); tp >= 1 (values below 1 read as 1).
StepMetrics MergeStepMetrics(const std::vector<StepMetrics>& ranks, int tp);

}  // namespace rlmesh
