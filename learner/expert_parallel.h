#pragma once

// Expert parallelism for the MoE families (Qwen3-MoE, Qwen2-MoE) over a
// c10d group of `ep` ranks (Gloo on CPU; the same calls on NCCL).
//
// The ranks are data-parallel: each trains on its own rows. Every rank holds
// the whole model except the routed experts, of which it holds experts
// [r E/ep, (r+1) E/ep) of every MoE layer. In each MoE layer a rank routes
// its own tokens (the router and the shared expert are replicated), sends
// each (token, chosen expert) pair to the expert's rank with an all-to-all,
// runs its experts on what it received, and sends the outputs back with a
// second all-to-all; the combine then accumulates them expert by expert in
// ascending order, as actor::MoeImpl does. Routing replay (MoeRouting) and
// the router's recorded logits work unchanged: routing happens before the
// exchange.
//
// Gradients. Each rank's loss is its local mean over `local_weight` units,
// as DataParallel's convention. An expert's gradient gathers every rank's
// tokens, so each rank's contribution is scaled by local_weight / W (W the
// sum over ranks) on its way back through the exchange and unscaled on its
// way on to the rank's own tokens: the expert receives the gradient of the
// global mean, the rest of each rank's graph its local one. Step then
// averages the replicated parameters' gradients over the ranks (weighted),
// clips the whole model's norm (the replicated part once, every rank's
// experts), and applies AdamW. The result equals one process training on
// all the ranks' rows together, up to summation order
// (learner/expert_parallel_test.cc: 1e-5 in fp32 after three AdamW steps).
//
// Several expert-parallel groups (options.data_group, expert data
// parallelism): D groups of ep ranks, each group holding every expert once,
// train D x ep slices of the rows. W is then the sum over all D x ep ranks;
// the replicated gradients average over all of them, and each expert's
// gradient (its group's share of the global mean) is summed over the D ranks
// that hold it. The same equality holds.
//
// Refused by name: a dense architecture, num_experts not divisible by ep.
// Creating the model needs the whole model's weights once (LoadFromFull);
// the other ranks' experts are then dropped.
//
// Collectives: every rank must make the same calls in the same order (the
// same MoE layers in every forward and backward, PrepareBackward and Step).
// A failed collective throws inside the autograd graph or returns ABORTED.
//
// Not thread-safe: one ExpertParallelModel per rank, used by one thread.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/model_config.h"
#include "actor/transformer.h"
#include "learner/data_parallel.h"
#include "learner/schedule.h"

namespace rlmesh::learner {

// OK when `config` is a MoE model whose experts split over `ep` ranks;
// otherwise INVALID_ARGUMENT / UNIMPLEMENTED naming the field.
absl::Status ValidateExpertParallel(const actor::ModelConfig& config, int ep);

// The expert index of a routed expert's parameter name
// ("model.layers.3.mlp.experts.5.up_proj.weight" -> 5), or -1.
int ExpertOf(const std::string& hf_name);

struct ExpertParallelOptions {
  AdamWOptions adamw;
  // Clip the whole model's gradient norm to this; 0 = no clipping.
  double grad_clip = 0.0;
  // The ranks holding this rank's experts in the other expert-parallel
  // groups, one from each (expert data parallelism). Null = one group.
  // Default null.
  c10::intrusive_ptr<c10d::Backend> data_group;
};

class ExpertParallelModel {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;

  // This rank's part of a model of shape `config` over `group` (null = one
  // rank, every expert). Weights as the module initialises them: call
  // LoadFromFull.
  static absl::StatusOr<std::unique_ptr<ExpertParallelModel>> Create(const actor::ModelConfig& config,
                                                                     c10::intrusive_ptr<c10d::Backend> group,
                                                                     const ExpertParallelOptions& options = {});

  // Copies this rank's part from the whole model's weights (Hugging Face
  // names, e.g. actor::TransformerImpl::NamedParameters()); INVALID_ARGUMENT
  // naming a missing or misshapen parameter.
  absl::Status LoadFromFull(const Named& full);
  // The whole model's weights, every expert gathered (every rank receives
  // them); ABORTED when a collective fails.
  absl::StatusOr<Named> GatherFull();

  // The module for forward passes (actor::TokenLogProbs, set_routing): the
  // whole architecture, whose other ranks' experts hold no data.
  actor::Transformer& model() { return model_; }

  // Before a step's backward passes: this rank's local weight (its loss is
  // the local mean over it). Sums the weights over the group (one
  // all-reduce) and sets the scale of the experts' gradients.
  absl::Status PrepareBackward(double local_weight);
  // After them: averages, clips and applies AdamW at `lr`. Does not zero
  // the gradients. stats.grad_norm is the whole model's, before clipping.
  absl::StatusOr<DataParallelStepStats> Step(double lr);
  void ZeroGrad();

  // This rank's parameters (the replicated ones and its experts) with
  // their Hugging Face names, in NamedParameters() order.
  Named NamedParameters() const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t experts_per_rank() const { return experts_per_rank_; }
  int64_t optimizer_steps() const { return adamw_ ? adamw_->steps() : 0; }

  // AdamW's moments over this rank's parameters, flat: the replicated ones,
  // then its experts, each in NamedParameters() order (a checkpoint's
  // per-rank file, which learner/moments_layout.h reads back).
  const at::Tensor& exp_avg() const { return adamw_->exp_avg(); }
  const at::Tensor& exp_avg_sq() const { return adamw_->exp_avg_sq(); }
  absl::Status LoadOptimizerState(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t steps);
  // The same from the whole model's moments under Hugging Face names (every
  // expert): keeps this rank's part. INVALID_ARGUMENT naming a missing or
  // misshapen one.
  absl::Status LoadWholeMoments(const Named& exp_avg, const Named& exp_avg_sq, int64_t steps);

 private:
  ExpertParallelModel() = default;
  // The experts' part of one MoE layer (actor::MoeImpl::ExpertsFn).
  at::Tensor RunExperts(actor::MoeImpl& moe, const at::Tensor& tokens, const at::Tensor& idx,
                        const at::Tensor& weights);
  bool IsLocal(const std::string& hf_name) const;
  // Sums `t` over the expert-parallel group and then options_.data_group
  // (every rank of both): throws on a failed collective.
  void SumOverAllRanks(at::Tensor& t);

  actor::ModelConfig config_;
  ExpertParallelOptions options_;
  c10::intrusive_ptr<c10d::Backend> group_;
  int rank_ = 0;
  int size_ = 1;
  int64_t experts_per_rank_ = 0;
  actor::Transformer model_{nullptr};
  // AdamW over this rank's parameters (no group: Step reduces first).
  std::unique_ptr<DataParallel> adamw_;
  std::vector<at::Tensor> replicated_, local_experts_;
  // Their Hugging Face names, in the same order.
  std::vector<std::string> replicated_names_, local_expert_names_;
  double local_weight_ = -1;
  double global_weight_ = 0;
  // local_weight / global_weight: the scale of this rank's contribution to
  // the experts' gradients.
  double grad_scale_ = 1.0;
};

}  // namespace rlmesh::learner
