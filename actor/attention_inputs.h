#pragma once

// The per-call inputs every decoder layer takes besides the hidden states:
// RoPE's cos/sin tables for the positions and the 4-D attention mask. Shared
// by the transformer and its tensor-parallel form (parallel/tensor_parallel.h)
// so that both rotate and mask with the same bits.

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>

#include "actor/model_config.h"
#include "actor/rope.h"

namespace rlmesh::actor {

// cos and sin [..., D] for int64 `positions` of any shape, in `dtype`, from
// the model's frequencies `base` (ComputeRope(config)). "dynamic" RoPE
// recomputes the frequencies when the longest position exceeds
// max_positions, as transformers does from the forward pass.
std::pair<at::Tensor, at::Tensor> RopeCosSin(const ModelConfig& config, const RopeFrequencies& base,
                                             const at::Tensor& positions, c10::ScalarType dtype);

// Segment ids of a shared prefix and its continuations (learner/batching.h
// PrefixSharing): the prefix is g * kSharedPrefixStride (g >= 1), each
// continuation g * kSharedPrefixStride + m (m >= 1), and a continuation's
// queries also see its prefix's keys. Ids below the stride are plain
// segments.
inline constexpr int64_t kSharedPrefixStride = int64_t{1} << 32;

// The bool mask [B,1,T,T] (true = may attend) for scaled_dot_product_attention
// from a [B,T] `attention_mask`: float or bool (1 = real token; padding keys
// hidden) or integer segment ids (packing: a query sees earlier keys of its
// own segment and, with kSharedPrefixStride, of its shared prefix; 0 =
// padding). Causal either way, and every query sees itself (a padded
// query's output is garbage the caller ignores, never NaN). Undefined
// `attention_mask` gives an undefined mask (plain causal).
at::Tensor AttentionMask4d(const at::Tensor& attention_mask, int64_t T, c10::Device device);

// The same rule for a block of it: [B,1,Q,K] for the queries at int64
// indices `queries` [Q] and the keys at `keys` [K] into the rows of the
// [B,T] `attention_mask` (defined), on its device. A query sees a key only
// at or before its own index. Context parallelism (learner/
// context_parallel.h) masks its attention blocks with it.
at::Tensor AttentionMaskBlock(const at::Tensor& attention_mask, const at::Tensor& queries, const at::Tensor& keys);

}  // namespace rlmesh::actor
