#pragma once

// Context parallelism for the Llama / Qwen2 / Qwen3 family over a c10d group
// of C ranks (Gloo on the CPU): each sequence's tokens are split over the
// ranks, every rank holding the whole (replicated) model.
//
// Split. A row of T tokens (padded to a multiple of 2C) is cut into 2C
// chunks and rank r takes chunks r and 2C - 1 - r (the "zig-zag" split), so
// that under causal attention every rank attends over the same number of
// key-query pairs. Embedding, MLPs, norms and the output head run on the
// rank's own tokens only: activations are 1/C of one process's.
//
// Attention. Each layer gathers the keys and values of every rank
// (after RoPE; [rows, kv_heads, T, head_dim] in all, for one layer at a
// time), and each of the rank's two query chunks attends over the chunks
// before it (no mask) and its own chunk (causal) with the CPU flash kernel,
// the two merged by their log-sum-exps. The backward pass gathers the keys
// and values again, runs the flash kernel's backward per block against the
// merged output and log-sum-exp (which is exact: the block's softmax is the
// whole row's), and sums the keys' and values' gradients over the group so
// that each rank keeps its own tokens'. Only the rank's own queries, keys,
// values, outputs and log-sum-exps are kept between the passes. The keys
// and values travel by a ring of point-to-point sends per layer and pass
// (C - 1 rounds; the gradients back by a ring reduce-scatter), or by
// c10d's all-gather and all-reduce (set_key_value_exchange); the whole
// sequence's are gathered before the blocks are computed, not overlapped
// with them (docs/design/parallelism.md, bench/context_parallel.md).
//
// Masks. With an attention mask (packed rows' segment ids, shared
// prefixes, or a padding mask; actor/attention_inputs.h) every rank holds
// the whole row's mask, and each query chunk attends over the keys before
// it in blocks of 256, the flash kernel taking each block's mask (the
// mask's rule for its queries and keys, causality included) in additive
// form; blocks no query of the chunk sees (a packed row's other
// documents) are skipped. The blocks merge, and their gradients follow,
// as above.
//
// Gradients. Every rank's loss covers its own tokens, but its gradient also
// reaches the other ranks' keys and values (the backward's sum over the
// group), so the ranks of a replica must scale their losses alike. With
// DataParallel's convention (learner/data_parallel.h) over a group holding
// every rank, each rank's local weight is its replica's loss weight / C
// (the same on all its context ranks) and its loss is the sum over its own
// tokens divided by that weight; the averaged gradient is then one
// process's token mean. A rank's share of the tokens may differ from 1/C
// (padding, masks): weighing each rank by its own tokens would scale the
// cross-rank terms wrongly. A loss that needs whole sequences (a
// per-sequence mean) is not built.
//
// With tensor parallelism (WrapTensorParallel, learner.cp x learner.tp):
// each rank holds a tensor-parallel slice of the model (parallel/
// tensor_parallel.h) and runs its slice's heads and channels on its zig-zag
// share of the tokens. The tensor-parallel collectives (the row-parallel
// sums, the vocabulary-parallel embedding and log-softmax) run over the
// tensor-parallel group, the ranks holding the same tokens; the keys and
// values travel over the context-parallel group, the ranks holding the
// same slices. The optimizer then steps each slice over the ranks holding
// it (every replica and context rank), the local weight as above.
//
// Activation checkpointing (the wrapped model's set_activation_checkpointing,
// or the tensor-parallel model's option): each layer keeps only its input,
// [rows, T / C, hidden], and runs again in the backward pass, its key and
// value exchange included; every rank recomputes its layers in the same
// (reverse) order, so the exchanges pair up.
//
// Limits, refused by name: MoE layers, a value head, and under tensor
// parallelism its sequence parallelism.
//
// Collectives: every rank of the group must make the same calls with the
// same [rows, T] shapes. A failed collective returns ABORTED.
//
// Not thread-safe: one ContextParallelModel per rank, used by one thread.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/logprobs.h"
#include "actor/model_config.h"

namespace rlmesh::actor {
class Transformer;
}  // namespace rlmesh::actor
namespace rlmesh::parallel {
class TensorParallelModel;
}  // namespace rlmesh::parallel

namespace rlmesh::learner {

// The positions [0, T_padded) that rank `rank` of `ranks` holds, in its
// order: chunk rank, then chunk 2 * ranks - 1 - rank, of T_padded / (2 *
// ranks) each, where T_padded is T rounded up to a multiple of 2 * ranks.
std::vector<int64_t> ZigZagPositions(int64_t T, int rank, int ranks);

// OK when `config` can run under context parallelism; UNIMPLEMENTED naming
// the field otherwise.
absl::Status ValidateContextParallel(const actor::ModelConfig& config);

struct ContextParallelOutput {
  // Log-probs and entropies of every position, [rows, T] fp32: the rank's
  // own positions carry values (and gradient); the others are 0.
  actor::TokenLogProbsOutput out;
  // 1 at the rank's own positions, 0 elsewhere, [rows, T] fp32.
  at::Tensor mine;
};

// ContextParallelOutput::mine for [rows, T] inputs on rank `rank` of
// `ranks`.
at::Tensor ZigZagMask(int64_t rows, int64_t T, int rank, int ranks);

// How the keys and values (and their gradients) travel between the ranks.
enum class KeyValueExchange {
  // A ring of point-to-point sends: C - 1 rounds, each passing on what came
  // from rank - 1 the round before (the gradients: a ring reduce-scatter).
  kRing,
  // c10d's all-gather, and an all-reduce of the whole sequence's gradients.
  kCollectives,
};

class ContextParallelModel {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;

  // Rank `group->getRank()` of a context-parallel group (null = one rank
  // holding every token). Weights as the model initialises them.
  static absl::StatusOr<std::unique_ptr<ContextParallelModel>> Create(const actor::ModelConfig& config,
                                                                      c10::intrusive_ptr<c10d::Backend> group,
                                                                      int64_t logprob_chunk = 128);
  // The same around an existing model, whose parameters it shares (the
  // learner's policy: its optimizer, checkpoints and weight sync see the
  // one module).
  static absl::StatusOr<std::unique_ptr<ContextParallelModel>> Wrap(const actor::Transformer& model,
                                                                    c10::intrusive_ptr<c10d::Backend> group,
                                                                    int64_t logprob_chunk = 128);
  // The same around a tensor-parallel model `tp` (which must outlive this
  // one): its slices are the parameters, and LoadFromFull goes through it.
  // `group` holds the ranks with the same slices and the other tokens.
  // UNIMPLEMENTED naming the option when `tp` runs sequence parallelism.
  // Under `tp`'s activation checkpointing this model checkpoints its layers.
  static absl::StatusOr<std::unique_ptr<ContextParallelModel>> WrapTensorParallel(
      parallel::TensorParallelModel& tp, c10::intrusive_ptr<c10d::Backend> group, int64_t logprob_chunk = 128);
  ~ContextParallelModel();
  ContextParallelModel(const ContextParallelModel&) = delete;
  ContextParallelModel& operator=(const ContextParallelModel&) = delete;

  // Copies the whole model's weights (Hugging Face names; under tensor
  // parallelism this rank's slices of them). INVALID_ARGUMENT naming a
  // missing or misshapen parameter.
  absl::Status LoadFromFull(const Named& full);
  // The model's parameters under Hugging Face names (every rank holds them
  // all, or under tensor parallelism its slices), and as the optimizer
  // takes them.
  Named NamedParameters() const;
  std::vector<at::Tensor> Parameters() const;

  // Per-token log-probs of `targets` (-1 = none) at this rank's positions
  // of [rows, T] int64 ids and positions; see ContextParallelOutput.
  // `attention_mask` [rows, T] as actor::AttentionMask4d takes it (segment
  // ids or a padding mask), or undefined (causal). INVALID_ARGUMENT for bad
  // inputs (before any collective); ABORTED when a collective fails.
  absl::StatusOr<ContextParallelOutput> TokenLogProbs(const at::Tensor& input_ids, const at::Tensor& positions,
                                                      const at::Tensor& targets, double temperature = 1.0,
                                                      const at::Tensor& attention_mask = {});

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Default kRing; every rank of the group must use the same.
  void set_key_value_exchange(KeyValueExchange exchange);

  struct Impl;

 private:
  ContextParallelModel() = default;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlmesh::learner
