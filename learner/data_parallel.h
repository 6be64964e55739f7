#pragma once

// Data-parallel learner shards over a c10d process group: Gloo for
// parameters on the CPU, NCCL (dist/nccl.h) for parameters on a GPU. Every
// collective runs on the parameters' device: the flat buffers live there,
// and host statistics (AllReduceSum) are staged through it.
//
// K ranks each hold a full copy of the model and a slice of the global
// batch. After backward on its slice, every rank calls Step(); gradients are
// summed over ranks in flattened buckets and the AdamW update is applied:
//   - plain DP: every rank updates all parameters (replicated AdamW state);
//   - ZeRO-1:   the flattened parameters are cut into K contiguous equal
//               shards (zero-padded at the end); rank r keeps AdamW state for
//               shard r only. Gradients are reduce-scattered (Gloo's native
//               reduce_scatter, or all-reduce + slice), each rank updates its
//               shard, and the parameters are all-gathered (native, or an
//               all-reduce of zero-filled buffers).
//
// Gradient convention (makes ragged shards exact). Each rank's gradients are
// those of its *local mean* loss over `local_weight` units (tokens for
// token-mean, sequences for the seq-mean modes). Step multiplies them by
// local_weight, sums over ranks, and divides by the global weight
// W = sum of local weights: the result is the gradient of the mean over the
// global batch, i.e. what one process holding the whole batch computes,
// however unevenly tokens fall on the ranks. For gradient accumulation over
// micro-batches, backward each micro-batch's loss sum divided by the rank's
// total local_weight (so the accumulated gradient is still the local mean).
//
// Collectives: every rank must call BroadcastParameters and Step the same
// number of times in the same order. An argument error is returned before
// any collective, which leaves the peers waiting until the group's timeout;
// a failed collective returns ABORTED and the group must be rebuilt. On
// Gloo a collective past the group's timeout is such a failure; on NCCL
// the host does not wait for the device, and ProcessGroupNCCL's watchdog
// ends the process instead (dist/nccl.h), which the coordinator restarts.
//
// Not thread-safe: one DataParallel per rank, used by one thread.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "learner/schedule.h"

namespace rlmesh::learner {

struct DataParallelOptions {
  // Largest all-reduce / broadcast bucket, in bytes. Default 25 MiB.
  int64_t bucket_bytes = 25 << 20;
  // Shard AdamW state and the update over ranks (ZeRO stage 1). Default off.
  bool zero1 = false;
  // ZeRO-1 only: reduce-scatter gradients as bucketed all-reduce + slice
  // instead of Gloo's reduce_scatter. Default false (native).
  bool emulate_reduce_scatter = false;
  // ZeRO-1 only: all-gather the parameters as a bucketed all-reduce of a
  // zero-filled buffer holding this rank's shard (exact) instead of Gloo's
  // all-gather. Default false (native).
  bool emulate_all_gather = false;
  // AdamW hyper-parameters (the learning rate is passed to each Step).
  AdamWOptions adamw;
  // Clip the global norm of the averaged gradient to this; 0 = no clipping.
  // Default 0.
  double grad_clip = 0.0;
  // Model parallelism (parallel/tensor_parallel.h, learner/fully_sharded.h):
  // when the parameters are this rank's part of a model split over
  // `norm_groups`, the gradient norm (reported, clipped to) is the whole
  // model's: each rank's squared norm, parameter i weighted by
  // norm_weights[i], is summed over each group in turn (the groups' ranks
  // together span the split). A parameter every model-parallel rank holds
  // whole (a norm's weight) gets weight 1/size so that it counts once; a
  // slice gets 1. Empty = the parameters are the whole model. Default empty.
  std::vector<c10::intrusive_ptr<c10d::Backend>> norm_groups;
  // One weight per parameter (empty = all 1). Default empty.
  std::vector<double> norm_weights;
  // Ranges of a parameter's flat elements that weigh otherwise: for
  // parameter i, every {begin, end, weight} in norm_ranges[i] gives
  // elements [begin, end) that weight instead of norm_weights[i] (a flat
  // ZeRO-3 shard that mixes slices and replicated norms). Empty, or one
  // list per parameter (ranges disjoint). Default empty.
  struct NormRange {
    int64_t begin = 0;
    int64_t end = 0;
    double weight = 1.0;
  };
  std::vector<std::vector<NormRange>> norm_ranges;

  absl::Status Validate() const;
};

struct DataParallelStepStats {
  // Global L2 norm of the averaged gradient, before clipping.
  double grad_norm = 0.0;
  // Sum of local weights over ranks.
  double global_weight = 0.0;
  // True when the gradient norm was not finite: no parameter changed.
  bool skipped = false;
  // Wall time of the gradient reduction (all-reduce or reduce-scatter and
  // the scalar all-reduce), the local update, and the parameter all-gather
  // (ZeRO-1; 0 otherwise), seconds.
  double reduce_seconds = 0.0;
  double update_seconds = 0.0;
  double gather_seconds = 0.0;
};

class DataParallel {
 public:
  // `params`: the model's parameters (e.g. module->parameters()), all
  // floating point of one dtype (fp32 or fp64) on one device. The handles
  // share storage with the model: Step writes the new values into them.
  // `group` may be null for a single process (world size 1, no collectives).
  static absl::StatusOr<std::unique_ptr<DataParallel>> Create(
      c10::intrusive_ptr<c10d::Backend> group, std::vector<at::Tensor> params,
      const DataParallelOptions& options);

  // Copies rank 0's parameters to every rank.
  absl::Status BroadcastParameters();

  // Averages the gradients (see the convention above), clips, applies AdamW
  // with learning rate `lr`, and leaves every rank with the same parameters.
  // Parameters without a gradient count as zero gradient. Does not zero the
  // gradients. REQUIRES: local_weight >= 0 finite; global weight > 0.
  absl::StatusOr<DataParallelStepStats> Step(double local_weight, double lr);

  // Sets every parameter's gradient to zero (where defined).
  void ZeroGrad();

  // Sums `t` (a contiguous CPU tensor, same shape on every rank) over the
  // group in place; a no-op for one process. For small statistics such as
  // the global whitening moments. With parameters on a GPU the sum runs on
  // a copy there.
  absl::Status AllReduceSum(at::Tensor& t);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Elements in all parameters together.
  int64_t numel() const { return numel_; }
  // The flat element range [shard_begin, shard_end) whose AdamW state this
  // rank holds (everything without ZeRO-1; may reach into the zero padding).
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }
  // Optimizer steps taken (the AdamW bias-correction count).
  int64_t steps() const { return steps_; }
  // This rank's AdamW moments over [shard_begin, shard_end), for checkpoints.
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  // Restores the moments and the step count (shapes as exp_avg()).
  absl::Status LoadOptimizerState(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                                  int64_t steps);
  // The same from the moments of every element, [numel()] each (what one
  // process without ZeRO-1 holds): this rank keeps its share. How a ZeRO-1
  // checkpoint written under another world size resumes.
  absl::Status LoadWholeOptimizerState(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                                       int64_t steps);

 private:
  DataParallel() = default;

  void PackParams(at::Tensor& flat) const;
  void UnpackParams(const at::Tensor& flat);
  void PackGrads(at::Tensor& flat, double scale) const;
  // All-reduce (SUM) of flat[0, n) in buckets; waits for all of them.
  void AllReduceBuckets(at::Tensor& flat, int64_t n);
  // Squared L2 norm of `grads`, the flat elements [begin, begin + numel)
  // of the parameters, each parameter's part weighted by norm_weights and
  // norm_ranges.
  absl::StatusOr<double> WeightedSquaredNorm(const at::Tensor& grads, int64_t begin) const;
  // Sums `sq` over options_.norm_groups (a no-op without any).
  void SumOverModelShards(double& sq) const;
  absl::StatusOr<DataParallelStepStats> StepReplicated(double local_weight, double lr);
  absl::StatusOr<DataParallelStepStats> StepZero1(double local_weight, double lr);

  // Constant after Create.
  c10::intrusive_ptr<c10d::Backend> group_;
  std::vector<at::Tensor> params_;
  std::vector<int64_t> offsets_;
  DataParallelOptions options_;
  int rank_ = 0;
  int world_size_ = 1;
  int64_t numel_ = 0;
  int64_t padded_ = 0;  // numel_ rounded up to a multiple of world_size_ (ZeRO-1).
  int64_t bucket_elems_ = 0;
  int64_t shard_begin_ = 0;
  int64_t shard_end_ = 0;

  // Working buffers and optimizer state.
  at::Tensor flat_params_;  // [padded_] (ZeRO-1) or [numel_].
  at::Tensor flat_grads_;   // [padded_] (ZeRO-1) or [numel_ + 1]: last = weight.
  at::Tensor shard_grads_;  // [shard size] (ZeRO-1).
  at::Tensor shard_params_; // [shard size] (ZeRO-1).
  at::Tensor exp_avg_;
  at::Tensor exp_avg_sq_;
  int64_t steps_ = 0;
};

// DataParallel's flat layout (no ZeRO-1: every element, parameters in
// order): `flat` cut into views shaped like `like`, and back (a copy).
std::vector<at::Tensor> UnflattenLike(const at::Tensor& flat, const std::vector<at::Tensor>& like);
at::Tensor FlattenAll(const std::vector<at::Tensor>& parts);

}  // namespace rlmesh::learner
