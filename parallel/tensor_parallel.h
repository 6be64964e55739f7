#pragma once

// Megatron-style tensor parallelism for the Llama / Qwen2 / Qwen3 family over
// a c10d group of `tp` ranks (Gloo on CPU; the same calls on NCCL).
//
// Each rank holds a slice of every large weight:
//   - column-parallel (rows of the [out, in] weight): q/k/v_proj (and their
//     biases), gate_proj, up_proj: rank r computes heads / tp query heads,
//     kv_heads / tp key/value heads and intermediate / tp MLP channels;
//   - row-parallel (columns): o_proj, down_proj: each rank's partial product
//     is summed over the group (one all-reduce per attention and per MLP);
//   - vocabulary-parallel: embed_tokens and lm_head rows [r V/tp, (r+1) V/tp):
//     the embedding looks up the rank's rows (zeros elsewhere) and sums over
//     the group; log-probs and entropies come from a vocabulary-parallel
//     log-softmax (max, sum of exponentials and target logit all-reduced), so
//     no rank ever holds the [tokens, V] logits.
// Norm weights (and Qwen3's q/k norms, which act per head) are replicated:
// every rank holds them whole and computes the same gradient for them.
//
// A value-head model (config.value_head: a reward model) gives Values: the
// scalar head is replicated and scores the replicated final hidden states
// (under sequence parallelism each rank its own rows, gathered). Its
// lm_head, never used, is frozen: left out of TrainedParameters, as plain
// DP leaves it out of the optimizer.
//
// Sequence parallelism (options.sequence_parallel): between the blocks the
// residual stream is split over the ranks along the tokens (each holds
// B*T/tp of the flattened rows), so the RMSNorms and residual adds run on a
// slice; an all-gather enters each block and a reduce-scatter replaces its
// all-reduce. Same results, 1/tp of the activations outside the blocks.
//
// The forward pass and its gradients equal the single-process model's up to
// floating-point summation order (learner/tensor_parallel_training_test.cc:
// 1e-5 in fp32 after three AdamW steps). Refused by name: heads, KV heads,
// intermediate size or vocabulary not divisible by tp (GQA with fewer KV
// heads than ranks would need replicated KV heads, not built), MoE
// architectures (expert parallelism is separate), an o_proj bias.
//
// Collectives: every rank must make the same calls in the same order with
// the same shapes. A failed collective throws inside the autograd graph;
// TokenLogProbs and the gathers turn it into ABORTED (the group is then
// unusable); the generation calls throw, as TransformerImpl's do.
//
// Not thread-safe: one TensorParallelModel per rank, used by one thread.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <functional>
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
#include "parallel/layout_shapes.h"

namespace rlmesh::parallel {

// OK when `config` can be split over `tp` ranks; otherwise
// INVALID_ARGUMENT / UNIMPLEMENTED naming the field.
absl::Status ValidateTensorParallel(const actor::ModelConfig& config, int tp);

// How a Hugging Face parameter is split: the dimension cut into tp equal
// slices, or -1 when every rank holds it whole.
int TensorParallelSplitDim(const std::string& hf_name);

// Resharding between tensor-parallel layouts (M learner ranks -> N rollout
// ranks, weight_sync's pieces): the model is cut into `pieces` pieces, a
// multiple of both tp sizes, so that every rank's slice is a run of whole
// pieces.
//
// Piece `piece` of `pieces` of parameter `name`, cut from `held`, which is
// slice `slice` of `slices` of it (slices = 1: the whole tensor): for a split
// parameter the piece-th of `pieces` equal parts of the whole along its
// split dimension (a view into `held`), for a replicated one `held` itself.
// INVALID_ARGUMENT when `slices` does not divide `pieces`, the piece lies
// outside the slice, or `pieces` does not divide the split dimension.
absl::StatusOr<at::Tensor> TensorParallelPiece(const std::string& name, const at::Tensor& held, int slice,
                                               int slices, int piece, int pieces);

// The inverse for consecutive pieces of parameter `name`: laid side by side
// along its split dimension (a replicated parameter: the first piece).
// REQUIRES: !pieces.empty().
at::Tensor JoinTensorParallelPieces(const std::string& name, const std::vector<at::Tensor>& pieces);

// The pieces of the tensor-parallel forward pass, for a caller that holds a
// shard's module itself (of TensorParallelShardConfig's shape,
// parallel/layout_shapes.h): learner/fully_sharded.h binds one's parameters
// a unit at a time when ZeRO-3 shards each tensor-parallel rank's slices
// over the replicas. `group` is the tensor-parallel group; null (one rank)
// makes each of them the whole model's plain computation. No sequence
// parallelism.
// Megatron's "f" (identity forward, gradient summed over the group: entering
// a column-parallel region) and "g" (sum over the group forward, identity
// backward: leaving a row-parallel one).
at::Tensor CopyToTensorParallel(const at::Tensor& x, c10d::Backend* group);
at::Tensor ReduceFromTensorParallel(const at::Tensor& x, c10d::Backend* group);
// Rank `rank`'s part of the vocabulary-parallel embedding of `ids` from the
// shard's rows of embed_tokens: its rows' vectors, zeros for other ids.
// Summed over the ranks it is the whole embedding.
at::Tensor VocabParallelLookup(actor::TransformerImpl& shard, const at::Tensor& ids, int rank);
// One decoder layer of a shard on the replicated residual stream [B,T,H].
at::Tensor TensorParallelLayer(actor::DecoderLayerImpl& layer, const at::Tensor& h, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& mask, c10d::Backend* group);
// Per-token log-probs of `targets` and entropies, [B,T] fp32, from the
// final norm's replicated output `hidden` (already entered with
// CopyToTensorParallel) and the shard's rows of the output projection: a
// vocabulary-parallel log-softmax (max, sum of exponentials and target
// logit reduced over the group), so no rank holds the [B,T,V] logits.
actor::TokenLogProbsOutput VocabParallelLogProbs(const at::Tensor& hidden, const at::Tensor& lm_head,
                                                 const at::Tensor& targets, double temperature, c10d::Backend* group);
// A replicated parameter whose gradient each rank sees only in part, to be
// summed over the group: Qwen3's per-head q/k norms and, under sequence
// parallelism, every RMSNorm and the value head.
bool TensorParallelGradientIsPartial(const std::string& hf_name, bool sequence_parallel);

struct TensorParallelOptions {
  // Split the residual stream along the tokens between blocks. Default off.
  bool sequence_parallel = false;
  // Activation checkpointing (actor::CheckpointedBlock): each block keeps
  // only its input, and the backward pass recomputes it, collectives and
  // all, on every rank. Default off.
  bool activation_checkpointing = false;
};

class TensorParallelModel {
 public:
  // A rank's slice of a model of shape `config` over `group` (rank and size
  // from the group; null = one rank, the whole model). Weights are left as
  // the shard module initialises them: call LoadFromFull.
  static absl::StatusOr<std::unique_ptr<TensorParallelModel>> Create(
      const actor::ModelConfig& config, c10::intrusive_ptr<c10d::Backend> group,
      const TensorParallelOptions& options = {});

  // Copies this rank's slice of every weight from `full` (Hugging Face names
  // and shapes, e.g. actor::TransformerImpl::NamedParameters(); a tied
  // lm_head may be absent). INVALID_ARGUMENT naming a missing or misshapen
  // parameter.
  absl::Status LoadFromFull(const std::vector<std::pair<std::string, at::Tensor>>& full);

  // Copies this rank's own slices (Hugging Face names, the slice shapes of
  // NamedParameters(), e.g. joined from weight_sync pieces), every parameter
  // exactly once. INVALID_ARGUMENT naming a missing, misshapen or unknown
  // one; nothing is copied then.
  absl::Status LoadSlices(const std::vector<std::pair<std::string, at::Tensor>>& slices);

  // The whole model's weights under Hugging Face names, gathered from every
  // rank (every rank receives them): what a checkpoint writes. ABORTED when
  // a collective fails.
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> GatherFull();

  // The same for any per-parameter state shaped like TrainedParameters()
  // (AdamW's moments), so that a checkpoint holds it in the layout-free form
  // and resumes under another tp: GatherFullOf gathers `local` (one tensor
  // per trained parameter, in TrainedParameters() order); SliceOf cuts this
  // rank's slices out of full-layout tensors, for every parameter in
  // Parameters() order or, `trained_only`, for the trained ones
  // (INVALID_ARGUMENT naming a missing or misshapen one).
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> GatherFullOf(
      const std::vector<at::Tensor>& local);
  absl::StatusOr<std::vector<at::Tensor>> SliceOf(const std::vector<std::pair<std::string, at::Tensor>>& full,
                                                  bool trained_only = false) const;
  // GatherFull and GatherFullOf one parameter at a time, so that no rank
  // holds more than one gathered parameter (a checkpoint streams them to
  // its file): `visit(name, full)` sees each whole parameter in their order,
  // valid only during the call. Every rank must call it. ABORTED when a
  // collective fails; otherwise the first error `visit` returns (after
  // which it is not called again, but the gathers go on).
  using Visit = std::function<absl::Status(const std::string&, const at::Tensor&)>;
  absl::Status VisitFull(const Visit& visit);
  absl::Status VisitFullOf(const std::vector<at::Tensor>& local, const Visit& visit);
  // The whole model's parameter names and shapes in GatherFull's order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> FullShapes() const;

  // Per-token log-probs of `targets` and entropies, [B,T] fp32, exactly as
  // actor::TokenLogProbs on the whole model (temperature divides the
  // logits; target < 0 gives log-prob 0). ids, positions, targets [B,T]
  // int64; `attention_mask` as TransformerImpl::ForwardHidden. Every rank
  // passes the same batch and gets the same result. Differentiable.
  absl::StatusOr<actor::TokenLogProbsOutput> TokenLogProbs(const at::Tensor& input_ids,
                                                           const at::Tensor& positions,
                                                           const at::Tensor& targets, double temperature = 1.0,
                                                           const at::Tensor& attention_mask = {});
  // A value-head model's values [B,T] fp32, as actor::TransformerImpl::
  // Values on the whole model; the same on every rank, same rules.
  // FAILED_PRECONDITION without a value head.
  absl::StatusOr<at::Tensor> Values(const at::Tensor& input_ids, const at::Tensor& positions,
                                    const at::Tensor& attention_mask = {});

  // Generation, the ranks in lockstep (no gradient): TransformerImpl's
  // Prefill and DecodeStep with this rank's key/value heads in `cache`,
  // returning the replicated final hidden states [B,H] / [N,H].
  at::Tensor Prefill(const at::Tensor& input_ids, const at::Tensor& lens, int64_t capacity,
                     actor::KvCache* cache);
  at::Tensor DecodeStep(const at::Tensor& ids, const at::Tensor& lens, int64_t max_len, actor::KvCache* cache);

  // The greedy next token over the whole vocabulary from hidden [N,H] (ties
  // to the lowest id, as argmax) and its log-prob, fp32 [N]; the logits
  // stay vocabulary-parallel.
  std::pair<at::Tensor, at::Tensor> GreedyNext(const at::Tensor& hidden);

  // Logits over the whole vocabulary [N, V] from hidden [N, H], the same on
  // every rank: each rank's [N, V/tp] slice, all-gathered. What sampling
  // with temperature / top-k / top-p needs (N rows, so small beside the
  // [tokens, V] a training step never gathers).
  at::Tensor Logits(const at::Tensor& hidden);

  // This rank's parameters with their Hugging Face names (slices where
  // split), in a fixed order.
  std::vector<std::pair<std::string, at::Tensor>> NamedParameters() const;
  std::vector<at::Tensor> Parameters() const;
  // What an optimizer steps: Parameters() but a value-head model's lm_head.
  std::vector<at::Tensor> TrainedParameters() const;
  bool Trained(const std::string& hf_name) const;
  // DataParallelOptions::norm_weights for TrainedParameters(): 1 for a
  // slice, 1/tp for a replicated parameter.
  std::vector<double> NormWeights() const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const actor::ModelConfig& config() const { return config_; }
  // The shard's own shape (heads / tp, ...), for memory accounting.
  const actor::ModelConfig& shard_config() const { return shard_config_; }
  // The shard's module, the group and the options, for a layout that runs
  // the shard's layers itself with the pieces above (context parallelism,
  // learner/context_parallel.h): the module's parameters are this model's.
  const actor::Transformer& shard() const { return shard_; }
  c10d::Backend* group() const { return size_ > 1 ? group_.get() : nullptr; }
  const TensorParallelOptions& options() const { return options_; }

 private:
  TensorParallelModel() = default;
  // The final norm's output in the stream's layout: replicated [B,T,H], or
  // under sequence parallelism this rank's rows of the padded [B*T, H].
  at::Tensor ForwardStream(const at::Tensor& input_ids, const at::Tensor& positions,
                           const at::Tensor& attention_mask);
  // ForwardStream made the replicated input of the vocabulary-parallel head.
  at::Tensor ForwardHidden(const at::Tensor& input_ids, const at::Tensor& positions,
                           const at::Tensor& attention_mask);
  // Vocabulary-parallel embedding: this rank's rows, zeros for other ids
  // (the caller sums over the ranks).
  at::Tensor Embed(const at::Tensor& ids);
  // `named` (this rank's tensors under parameter names) gathered whole:
  // all of them, or each passed to `visit` in turn.
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> Gather(
      const std::vector<std::pair<std::string, at::Tensor>>& named);
  absl::Status VisitGathered(const std::vector<std::pair<std::string, at::Tensor>>& named, const Visit& visit);
  // `local` (one tensor per trained parameter) under the trained
  // parameters' names; INVALID_ARGUMENT naming a misshapen one.
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> TrainedNamed(
      const std::vector<at::Tensor>& local) const;
  // All-reduce of a row-parallel partial product, outside autograd.
  at::Tensor SumOverShards(const at::Tensor& partial);

  actor::ModelConfig config_;
  actor::ModelConfig shard_config_;
  TensorParallelOptions options_;
  c10::intrusive_ptr<c10d::Backend> group_;
  int rank_ = 0;
  int size_ = 1;
  // The shard's layers and norms, built from shard_config_ (its embedding
  // and lm_head hold the vocabulary slice).
  actor::Transformer shard_{nullptr};
  actor::RopeFrequencies rope_;
};

}  // namespace rlmesh::parallel
