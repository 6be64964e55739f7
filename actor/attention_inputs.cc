#include "actor/attention_inputs.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/ones.h>

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
  auto opts = at::TensorOptions().dtype(at::kBool).device(device);
  auto causal = at::ones({T, T}, opts).tril();
  auto eye = at::eye(T, opts);
  if (attention_mask.is_floating_point() || attention_mask.scalar_type() == at::kBool) {
    auto keys = attention_mask.to(device, at::kBool).view({-1, 1, 1, T});
    return causal.logical_and(keys.logical_or(eye));
  }
  auto seg = attention_mask.to(device, at::kLong);
  auto query = seg.view({-1, 1, T, 1}), key = seg.view({-1, 1, 1, T});
  auto seen = query.eq(key);
  if (seg.numel() > 0 && seg.max().item<int64_t>() >= kSharedPrefixStride) {
    // A shared prefix's keys (a multiple of the stride) are seen by the
    // continuations of the same g.
    auto is_prefix = key.remainder(kSharedPrefixStride).eq(0);
    auto same_group = query.div(kSharedPrefixStride, "floor").eq(key.div(kSharedPrefixStride, "floor"));
    seen = seen.logical_or(is_prefix.logical_and(same_group));
  }
  auto keys = key.gt(0);
  return causal.logical_and(seen.logical_and(keys).logical_or(eye));
}

}  // namespace rlmesh::actor
