#pragma once

// Batching and packing for the learner: tokenised sequences -> padded (or
// packed) [B, T] tensors, contiguous micro-batches under a token budget, and
// weighted metric means over micro-batches. Plain functions and values; no
// thread-safety concerns.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "actor/model_config.h"
#include "learner/losses.h"
#include "proto/learner.pb.h"

namespace rlmesh::learner {

// One tokenised training sequence.
struct Seq {
  std::vector<int64_t> ids;
  // Per position t (predicting ids[t+1]): loss weight, behaviour log-prob.
  std::vector<float> mask;
  std::vector<float> behaviour;
};

// A padded batch of sequences: [B, T] tensors (T = longest sequence).
struct Batch {
  at::Tensor input_ids, positions, targets, mask, behaviour;
  // Packed batches only: segment id per position (1, 2, ... per sequence in
  // the row; 0 = padding; shared prefixes as attention_inputs.h says), the
  // attention mask that keeps them apart.
  at::Tensor segments;
  int64_t tokens = 0;  // real tokens (sum of lengths)
};


// prompt + response, truncated to `max_len` tokens; the mask marks the
// positions t >= first_masked (clamped to 0) that predict a next token.
Seq PromptResponseSeq(const std::vector<int>& prompt, const std::vector<int>& response, int64_t max_len,
                      int64_t first_masked);

// SFT packing: the sequences, in order, first-fit into rows of at most
// `row_len` tokens; positions restart and targets stop at each sequence's
// end, so every sequence sees and predicts exactly what it would alone.
// `row_lengths` gets each row's used length.
Batch MakePackedBatch(const std::vector<Seq>& seqs, int64_t row_len, std::vector<int64_t>* row_lengths);

// Packed rows as given: row r holds rows[r]'s sequences in order, each its
// own segment (positions restart, attention stays inside it), as
// MakePackedBatch lays them out. `row_lengths` gets each row's length.
Batch MakeRowsBatch(const std::vector<std::vector<const Seq*>>& rows, std::vector<int64_t>* row_lengths);

// Shared prompts in RL packing. A GRPO group's samples start with the same
// prompt, and the tokens before a response do not depend on it (attention is
// causal), so the group's prompt can run once: a prefix segment that each
// sample's own segment also attends to (actor/attention_inputs.h
// kSharedPrefixStride). A group shares when its samples' first p + 1 tokens
// are equal and none of the first p positions is in the loss; each sample's
// segment then starts at token p (its first predicted token comes from
// there). It does when that lowers the estimated cost of the group's
// forward: tokens through the linear layers plus `pair_cost` per
// query-key pair of attention (the mask makes every pair of a row cost).
struct PrefixSharing {
  // Per sequence of `seqs` (same index): its group. Null = no sharing.
  const std::vector<int64_t>* groups = nullptr;
  // One attention query-key pair's FLOPs over one token's through the
  // linear layers (PairCost).
  double pair_cost = 0;
};

// How many first tokens one group's rows (`members`) share in a packed
// micro-batch: p as PrefixSharing says, or 0 when they share none or
// sharing would not lower the estimated cost.
int64_t PromptToShare(const std::vector<const Seq*>& members, double pair_cost);

// PrefixSharing::pair_cost for a dense decoder: 4 * heads * head_dim per
// pair per layer, against 2 * (the layer's projections) per token per layer
// plus the output head's 2 * hidden * vocab.
double PairCost(const actor::ModelConfig& config);

// RL packing of one micro-batch: sequences [begin, end) of `seqs`, longest
// first, first-fit into rows of at most max(row_len, the longest shared
// group) tokens (REQUIRES: row_len >= each of their lengths), each its own
// segment as MakeRowsBatch lays them out, or a shared group's prefix and
// samples (PrefixSharing). Unpack maps a per-token output of the packed rows
// ([R, W]) to the padded layout MakeBatch gives those sequences ([end -
// begin, row_len], zeros past each sequence's end; a shared prefix's outputs
// copied to each of its samples) with one index_select, so gradients flow
// back through it.
struct PackedRows {
  Batch batch;
  int64_t seqs = 0, row_len = 0;
  // Sequences whose prefix is shared.
  int64_t shared_seqs = 0;
  // [seqs * row_len]: flat index into the packed output with a zero slot
  // appended (R * W = padding).
  at::Tensor gather;
  at::Tensor Unpack(const at::Tensor& packed) const;
  // The other way, for inputs given per padded position: `padded`
  // [seqs * row_len, ...] -> [R * W, ...], each sequence's positions where
  // the packed rows hold them and `fill` in the packed rows' padding.
  // REQUIRES: no shared prefix (each packed position holds one sequence's).
  at::Tensor Pack(const at::Tensor& padded, const at::Scalar& fill) const;
};
PackedRows PackSeqs(const std::vector<Seq>& seqs, int64_t begin, int64_t end, int64_t row_len,
                    const PrefixSharing& sharing = {});

// One row per sequence, padded to the longest; `with_behaviour` fills
// Batch::behaviour from Seq::behaviour.
Batch MakeBatch(const std::vector<Seq>& seqs, bool with_behaviour);

// Rows [begin, end) of `full`, narrowed to the longest row among them.
at::Tensor Rows(const at::Tensor& full, int64_t begin, int64_t end, int64_t T);

// Contiguous micro-batches of rows [begin, end): each has at most
// `max_tokens` padded tokens (rows x longest row), and at least one row.
// `together` (optional, per row): true keeps row r in row r - 1's
// micro-batch, unless their run of rows alone is over the budget.
std::vector<std::pair<int64_t, int64_t>> MicroBatches(const std::vector<int64_t>& lengths, int64_t begin,
                                                      int64_t end, int64_t max_tokens,
                                                      const std::vector<bool>* together = nullptr);

// `micro` cut further until there are at least `at_least` micro-batches or
// none can be cut: the micro-batch with the most rows is split in two at
// the row boundary nearest its middle that `together` (as MicroBatches
// takes it) allows. Order and coverage stay. For a pipeline, whose idle
// time shrinks with the number of micro-batches.
std::vector<std::pair<int64_t, int64_t>> AtLeastMicroBatches(std::vector<std::pair<int64_t, int64_t>> micro,
                                                             int64_t at_least,
                                                             const std::vector<bool>* together = nullptr);

// Rank r's share of a global batch of G groups over K data-parallel
// replicas. The batch is cut into `mini_batches` contiguous mini-batches
// [m*G/M, (m+1)*G/M) first, and the rank takes its contiguous share
// [r*n/K, (r+1)*n/K) of each (n groups in it), in mini-batch order: so
// mini-batch m holds the same groups whatever K is, and K replicas step
// exactly as one process does when every share has as many rows (G a
// multiple of M*K, groups of one size). With one mini-batch: [r*G/K,
// (r+1)*G/K).
std::vector<TrajectoryGroup> RankSlice(std::vector<TrajectoryGroup> all, int rank, int world,
                                       int mini_batches = 1);

// Dynamic sampling with refill: the first `keep` groups of `all`, in order,
// whose rewards are not all equal (a one-sample group counts as zero
// variance). Every shard calls it on the same ordered global batch, so all
// keep the same groups. `metrics` (if not null) gets
// refill_groups_sampled (|all|), refill_groups_zero_variance and
// refill_groups_surplus (informative groups beyond `keep`, left out).
std::vector<TrajectoryGroup> KeepInformativeGroups(std::vector<TrajectoryGroup> all, int64_t keep,
                                                   Metrics* metrics);

// Weighted means of metrics over micro-batches.
class MetricMeans {
 public:
  void Add(const Metrics& m, double w) {
    for (const auto& [k, v] : m) {
      auto& [num, den] = acc_[k];
      num += v * w;
      den += w;
    }
  }
  void Into(std::map<std::string, double>* out) const {
    for (const auto& [k, nd] : acc_) {
      if (nd.second > 0) (*out)[k] = nd.first / nd.second;
    }
  }
  // The names, and the weighted sums and weights in name order (2 per
  // name), to be summed with other ranks' (Unpack takes them back).
  std::vector<std::string> Keys() const {
    std::vector<std::string> out;
    for (const auto& kv : acc_) out.push_back(kv.first);
    return out;
  }
  std::vector<double> Sums() const {
    std::vector<double> out;
    for (const auto& kv : acc_) {
      out.push_back(kv.second.first);
      out.push_back(kv.second.second);
    }
    return out;
  }
  // REQUIRES: sums.size() == 2 * Keys().size().
  void SetSums(const std::vector<double>& sums) {
    size_t i = 0;
    for (auto& kv : acc_) {
      kv.second = {sums[i], sums[i + 1]};
      i += 2;
    }
  }

 private:
  std::map<std::string, std::pair<double, double>> acc_;
};


}  // namespace rlmesh::learner
