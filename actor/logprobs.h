#pragma once

// Per-token log-probabilities and entropies of given sequences, computed in
// chunks over time so that no more than [B, chunk, V] of logits exists at
// once, forward or backward (the backward pass recomputes each chunk's logits
// instead of keeping them). Differentiable with respect to the model.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "actor/transformer_fwd.h"

namespace rlmesh::actor {

struct TokenLogProbsOutput {
  // log softmax(logits / temperature)[target], [B,T] fp32; 0 where target < 0.
  at::Tensor logprobs;
  // Entropy of softmax(logits / temperature), [B,T] fp32.
  at::Tensor entropy;
};

// input_ids, positions, targets: [B,T] int64. Position t scores targets[:, t]
// (usually input_ids shifted left by one; use -1 for "no target").
// `chunk_size` > 0 time steps per chunk. `temperature` > 0 divides the logits,
// exactly as Generator does for behaviour log-probs, so on-policy the two
// agree. `attention_mask` [B,T] (optional) hides padding keys.
// INVALID_ARGUMENT on bad shapes or values; LibTorch errors become INTERNAL.
absl::StatusOr<TokenLogProbsOutput> TokenLogProbs(Transformer& model, const at::Tensor& input_ids,
                                                  const at::Tensor& positions, const at::Tensor& targets,
                                                  int64_t chunk_size, double temperature = 1.0,
                                                  const at::Tensor& attention_mask = {});

// The same from final hidden states [B,T,H] and an output weight [V,H].
absl::StatusOr<TokenLogProbsOutput> TokenLogProbsFromHidden(const at::Tensor& hidden, const at::Tensor& weight,
                                                            const at::Tensor& targets, int64_t chunk_size,
                                                            double temperature = 1.0);

}  // namespace rlmesh::actor
