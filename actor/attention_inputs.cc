#include "actor/attention_inputs.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>

namespace rlmesh::actor {

std::pair<at::Tensor, at::Tensor> RopeCosSin(const ModelConfig& config, const RopeFrequencies& base,
                                             const at::Tensor& positions, c10::ScalarType dtype) {
  at::Tensor inv = base.inv_freq;
  if (config.rope.type == "dynamic" && positions.numel() > 0) {
    // As transformers: the longest position in the batch picks the base.
    // Generation never gets here past max_positions (it stops there), so
    // this only changes scoring of sequences longer than the context.
    const int64_t seq_len = positions.max().item<int64_t>() + 1;
    if (seq_len > config.max_positions) inv = ComputeRope(config, seq_len).inv_freq;
  }
  inv = inv.to(positions.device());
  auto freqs = positions.to(at::kFloat).unsqueeze(-1) * inv;  // [..., D/2]
  auto emb = at::cat({freqs, freqs}, -1);
  auto cos = emb.cos(), sin = emb.sin();
  if (base.scaling != 1.0) {
    cos = cos * base.scaling;
    sin = sin * base.scaling;
  }
  return {cos.to(dtype), sin.to(dtype)};
}

at::Tensor AttentionMask4d(const at::Tensor& attention_mask, int64_t T, c10::Device device) {
  if (!attention_mask.defined()) return {};
  const at::Tensor index = at::arange(T, at::TensorOptions().dtype(at::kLong).device(device));
  return AttentionMaskBlock(attention_mask.to(device), index, index);
}

at::Tensor AttentionMaskBlock(const at::Tensor& attention_mask, const at::Tensor& queries, const at::Tensor& keys) {
  const c10::Device device = attention_mask.device();
  const at::Tensor qi = queries.to(device).view({-1, 1}), ki = keys.to(device).view({1, -1});
  const int64_t Q = qi.size(0), K = ki.size(1);
  const at::Tensor causal = qi.ge(ki), self = qi.eq(ki);  // [Q, K]
  if (attention_mask.is_floating_point() || attention_mask.scalar_type() == at::kBool) {
    const at::Tensor real = attention_mask.to(at::kBool).index_select(1, ki.view({-1})).view({-1, 1, 1, K});
    return causal.logical_and(real.logical_or(self));
  }
  const at::Tensor seg = attention_mask.to(at::kLong);
  const at::Tensor query = seg.index_select(1, qi.view({-1})).view({-1, 1, Q, 1});
  const at::Tensor key = seg.index_select(1, ki.view({-1})).view({-1, 1, 1, K});
  at::Tensor seen = query.eq(key);
  if (seg.numel() > 0 && seg.max().item<int64_t>() >= kSharedPrefixStride) {
    // A shared prefix's keys (a multiple of the stride) are seen by the
    // continuations of the same g.
    const at::Tensor is_prefix = key.remainder(kSharedPrefixStride).eq(0);
    const at::Tensor same_group =
        query.div(kSharedPrefixStride, "floor").eq(key.div(kSharedPrefixStride, "floor"));
    seen = seen.logical_or(is_prefix.logical_and(same_group));
  }
  return causal.logical_and(seen.logical_and(key.gt(0)).logical_or(self));
}

}  // namespace rlmesh::actor
