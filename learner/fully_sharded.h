#pragma once

// Fully sharded data parallelism (ZeRO stage 3, FSDP-style) for the Llama /
// Qwen2 / Qwen3 family over a c10d group of `dp` ranks (Gloo on CPU; the
// same calls on NCCL).
//
// The model is cut into units: the embedding, each decoder layer, and the
// final norm with the output head. A unit's parameters are flattened into
// one vector, zero-padded to a multiple of dp, and rank r keeps only slice r
// of it (its "shard"), with the shard's gradient and AdamW state: every
// parameter, gradient and moment is held once over the group, 1/dp per rank.
//
// Forward, unit by unit: all-gather the unit's shards into its full vector,
// run the unit with no gradient, free the vector. The next unit's all-gather
// is started before this one computes (prefetch). Backward, in reverse: gather
// the unit again, recompute its forward with gradient from its saved input
// (activation checkpointing at unit boundaries: only the units' inputs are
// kept between forward and backward), backpropagate, reduce-scatter the
// parameter gradients into each rank's shard, free. The vocabulary logits
// never outlive the head unit (actor::TokenLogProbsFromHidden chunks them).
//
// Each rank runs its own rows of the batch; the gradients follow
// DataParallel's convention (learner/data_parallel.h): ZeroGrad(local_weight)
// before a step's backward passes, where each rank's loss is its local mean
// over local_weight units, and Step(lr) divides by the global weight, clips
// the norm of the whole model's gradient and applies AdamW to each shard. The
// results equal one process holding the whole batch up to floating-point
// summation order (learner/fully_sharded_test.cc: 1e-5 in fp32 after three
// AdamW steps).
//
// Checkpoints stay layout-free: GatherFull returns the Hugging Face layout
// (what a checkpoint writes), GatherFullOf does the same for the optimizer's
// moments, and SliceOf cuts a rank's shards out of full tensors, so a run
// saved at one dp resumes at another (or on one process).
//
// A value-head model (config.value_head: a reward model, a critic) runs
// through the same units with Values instead of TokenLogProbs: the head unit
// is the final norm and the scalar head. Its lm_head, never used, is sharded
// but frozen, out of the optimizer and its moments, as plain DP leaves it
// out (learner/model_set.cc); the gathers still return it.
//
// With tensor parallelism inside each replica (options.tensor_parallel,
// parallel/tensor_parallel.h), ZeRO-3 shards each tensor-parallel rank's
// slices: a unit's flat vector holds this rank's slices of its parameters
// (column-, row- and vocabulary-parallel as TensorParallelModel cuts them,
// norms whole), and `group` is the replicas that hold the same slices, so a
// rank keeps 1/(dp*tp) of every split parameter. The units compute as
// TensorParallelModel's blocks do (a unit's collectives over the
// tensor-parallel group run inside its forward and recomputed backward),
// the ranks of one tensor-parallel group pass the same rows, the gradient
// norm sums over both groups with a replicated parameter counted once, and
// the gathers return the whole model. No sequence parallelism; the
// log-probs are vocabulary-parallel rather than chunked.
//
// Limits: the model is built whole once in Create (to initialise and then
// shard it), so creation needs the whole model's fp32 weights in memory for a
// moment; MoE architectures (the router's auxiliary loss and routing replay
// are not threaded through the units) are refused by name.
//
// Collectives: every rank must make the same calls in the same order with
// the same shapes: TokenLogProbs, backward, Step, the gathers. A failed
// collective throws inside the autograd graph; TokenLogProbs, Step and the
// gathers return ABORTED (the group is then unusable). A forward must be
// followed by its backward before the next forward (or be run under
// at::NoGradGuard): the backward consumes the units' prefetched parameters.
//
// Not thread-safe: one FullyShardedModel per rank, used by one thread.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/logprobs.h"
#include "actor/model_config.h"
#include "actor/rope.h"
#include "actor/transformer.h"
#include "learner/data_parallel.h"

namespace rlmesh::learner {

struct FullyShardedOptions {
  // All-gather the next unit's parameters while the current unit computes.
  // Default true.
  bool prefetch = true;
  // Time steps per chunk of the vocabulary logits in the head unit. Default
  // 128.
  int64_t logprob_chunk = 128;
  // AdamW and gradient clipping (the rest of DataParallelOptions, buckets
  // and ZeRO-1, does not apply to shards and must stay at its default).
  DataParallelOptions optimizer;
  // The tensor-parallel group this rank's slices belong to (see above); null
  // or of size 1 for none. Default null.
  c10::intrusive_ptr<c10d::Backend> tensor_parallel;
};

// OK when `config` can be fully sharded; UNIMPLEMENTED naming the field
// otherwise.
absl::Status ValidateFullySharded(const actor::ModelConfig& config);

class FullyShardedModel {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;

  // Rank `group->getRank()`'s shards of a model shaped `config` (null group =
  // one rank holding everything). Weights are as the model initialises them
  // (torch::manual_seed first); call LoadFromFull to set them.
  static absl::StatusOr<std::unique_ptr<FullyShardedModel>> Create(const actor::ModelConfig& config,
                                                                   c10::intrusive_ptr<c10d::Backend> group,
                                                                   const FullyShardedOptions& options = {});
  ~FullyShardedModel();
  FullyShardedModel(const FullyShardedModel&) = delete;
  FullyShardedModel& operator=(const FullyShardedModel&) = delete;

  // Sets this rank's shards from the whole model's weights (Hugging Face
  // names and shapes; a tied lm_head may be absent). INVALID_ARGUMENT naming
  // a missing or misshapen parameter.
  absl::Status LoadFromFull(const Named& full);

  // The whole model's weights under Hugging Face names, gathered on every
  // rank (a frozen lm_head last). ABORTED when a collective fails.
  absl::StatusOr<Named> GatherFull();
  // The same for per-shard state shaped like Shards() (AdamW's moments).
  absl::StatusOr<Named> GatherFullOf(const std::vector<at::Tensor>& shards);
  // The whole model's weights one unit at a time, so that no rank holds
  // more than one gathered unit: `visit(name, full)` sees each parameter,
  // in GatherFull's order, as a view into the unit's gathered buffer, valid
  // only during the call (clone what is kept). Every rank must call it.
  // ABORTED when a collective fails; otherwise the first error `visit`
  // returns (after the remaining units' gathers, which every rank makes).
  absl::Status VisitFull(const std::function<absl::Status(const std::string&, const at::Tensor&)>& visit);
  // This rank's shards (Shards() shapes) of full-layout tensors (a frozen
  // lm_head, not a shard, may be absent).
  absl::StatusOr<std::vector<at::Tensor>> SliceOf(const Named& full) const;

  // Per-token log-probs of `targets` and entropies, [B,T] fp32, as
  // actor::TokenLogProbs on the whole model; each rank passes its own rows
  // (their number may differ between ranks: the collectives do not depend on
  // the batch). Differentiable with respect to the shards. `logprob_chunk`
  // > 0 overrides the options' for this call.
  absl::StatusOr<actor::TokenLogProbsOutput> TokenLogProbs(const at::Tensor& input_ids,
                                                           const at::Tensor& positions,
                                                           const at::Tensor& targets, double temperature = 1.0,
                                                           const at::Tensor& attention_mask = {},
                                                           int64_t logprob_chunk = 0);
  // A value-head model's values [B,T] fp32, as actor::TransformerImpl::
  // Values on the whole model, under the same rules as TokenLogProbs
  // (FAILED_PRECONDITION for a model without a value head; TokenLogProbs
  // is refused for one whose lm_head is frozen).
  absl::StatusOr<at::Tensor> Values(const at::Tensor& input_ids, const at::Tensor& positions,
                                    const at::Tensor& attention_mask = {});

  // Zeroes the shards' gradients and records this rank's local weight for
  // the coming backward passes (see the convention above). REQUIRES:
  // local_weight >= 0 and finite.
  void ZeroGrad(double local_weight);
  // Averages over the global weight, clips and applies AdamW to this rank's
  // shards. INVALID_ARGUMENT when the global weight is not > 0; ABORTED when
  // a collective fails.
  absl::StatusOr<DataParallelStepStats> Step(double lr);

  // The leaf tensors the optimizer updates: one flat shard per unit.
  std::vector<at::Tensor> Shards() const;
  // AdamW state over Shards() concatenated, and its restore (for
  // checkpoints: split per shard and use GatherFullOf / SliceOf).
  const at::Tensor& exp_avg() const { return optimizer_->exp_avg(); }
  const at::Tensor& exp_avg_sq() const { return optimizer_->exp_avg_sq(); }
  int64_t steps() const { return optimizer_->steps(); }
  absl::Status LoadOptimizerState(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t steps);
  // AdamW's moments over the whole model, gathered one unit at a time so
  // that no rank holds more than one gathered unit (a checkpoint streams
  // them to its file): exp_avg's (k = 0), then exp_avg_sq's (k = 1), each
  // parameter in turn, as views valid only during the call. Laid end to end
  // they are DataParallel's flat layout without ZeRO-1 (the model's
  // NamedParameters order), so a checkpoint written from them resumes under
  // either layout and any dp. Every rank must call it. ABORTED when a
  // collective fails; otherwise the first error `visit` returns (after which
  // it is not called again, but the gathers go on).
  absl::Status VisitMoments(const std::function<absl::Status(int k, const std::string&, const at::Tensor&)>& visit);
  // Sets this rank's part of the moments from the whole model's, in the
  // same layout. INVALID_ARGUMENT when the sizes are not full_numel().
  absl::Status LoadMoments(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t steps);
  // The same, reading only this rank's share: `read(k, begin, count)` gives
  // elements [begin, begin + count) of the whole model's exp_avg (k = 0) or
  // exp_avg_sq (k = 1) in that layout (learner/moments_layout.h's
  // OpenMomentsRanges reads them from a checkpoint), so no rank holds the
  // whole moments. Without tensor parallelism only (a rank's TP slices are
  // not ranges of the flat layout): FAILED_PRECONDITION otherwise; a read's
  // error as it is.
  using MomentsReader = std::function<absl::StatusOr<at::Tensor>(int k, int64_t begin, int64_t count)>;
  absl::Status LoadMomentsFrom(const MomentsReader& read, int64_t steps);
  // True when the units hold tensor-parallel slices.
  bool tensor_parallel() const { return tp_group_ != nullptr; }

  // This rank in `group` (its replica) and the group's size.
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Over both groups: replica-major, the tensor-parallel rank innermost
  // (the learner's rank layout). Without tensor parallelism rank() and
  // size().
  int world_rank() const { return rank_ * tp_size_ + tp_rank_; }
  int world_size() const { return size_ * tp_size_; }
  const actor::ModelConfig& config() const { return config_; }
  // The whole model's parameter names and shapes in VisitFull's order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> FullShapes() const;
  // Elements the optimizer trains in the whole model (a frozen lm_head
  // aside), and in this rank's shards (with padding; frozen ones included).
  int64_t full_numel() const;
  int64_t shard_numel() const;

  // The autograd functions reach the model through these (not for callers).
  struct Unit;
  at::Tensor AcquireFull(size_t unit, size_t next);
  void Bind(size_t unit, const at::Tensor& full);
  void Unbind(size_t unit);
  at::Tensor ReduceScatterGrads(size_t unit, const std::vector<at::Tensor>& grads);
  std::vector<at::Tensor> UnitParams(size_t unit) const;
  size_t num_units() const { return units_.size(); }
  // The unit's computation on bound parameters: embedding (inputs: ids),
  // layer (h, cos, sin, mask), head (h, targets; temperature).
  std::vector<at::Tensor> Compute(size_t unit, const std::vector<at::Tensor>& inputs);

 private:
  FullyShardedModel() = default;
  void Prefetch(size_t unit);
  // The embedding and decoder-layer units: the hidden states entering the
  // head unit.
  at::Tensor Layers(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& attention_mask);
  // This rank's slice of the whole parameter `full` (itself without tensor
  // parallelism or for a replicated parameter).
  at::Tensor LocalOf(const std::string& name, const at::Tensor& full) const;
  // The whole parameter from every tensor-parallel rank's `local` slice
  // (every rank of the group must call it; `local` itself without tensor
  // parallelism or for a replicated parameter). Throws when the gather
  // fails.
  at::Tensor WholeOf(const std::string& name, const at::Tensor& local);
  // `unit`'s shard cut from full-layout tensors by name.
  absl::StatusOr<at::Tensor> SliceUnit(const Unit& unit, const std::map<std::string, at::Tensor>& by_name) const;
  // GatherFullOf and VisitFull: `shards` (Shards() shapes) gathered unit by
  // unit, then, `with_frozen`, the frozen lm_head; each parameter's full
  // view passed to `visit`.
  absl::Status VisitGathered(const std::vector<at::Tensor>& shards, bool with_frozen,
                             const std::function<absl::Status(const std::string&, const at::Tensor&)>& visit);

  actor::ModelConfig config_;
  FullyShardedOptions options_;
  c10::intrusive_ptr<c10d::Backend> group_;
  int rank_ = 0;
  int size_ = 1;
  // options.tensor_parallel when of size > 1, else null.
  c10::intrusive_ptr<c10d::Backend> tp_group_;
  int tp_rank_ = 0;
  int tp_size_ = 1;
  // The module tree (the tensor-parallel shard's shape under tp); its
  // parameters are empty except while a unit is bound.
  actor::Transformer model_{nullptr};
  actor::RopeFrequencies rope_;
  std::vector<std::unique_ptr<Unit>> units_;
  // A value-head model's lm_head: sharded like a unit, never bound or
  // trained (null otherwise).
  std::unique_ptr<Unit> frozen_;
  // The head unit computes values (Values) instead of log-probs; set by the
  // forward pass, read again by its backward.
  bool head_values_ = false;
  // All-gathers started ahead, by unit.
  std::map<size_t, std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> prefetched_;
  double local_weight_ = 1.0;
  double temperature_ = 1.0;
  int64_t logprob_chunk_ = 128;
  std::unique_ptr<DataParallel> optimizer_;
};

}  // namespace rlmesh::learner
