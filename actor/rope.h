#pragma once

// Rotary position embedding frequencies for every RopeScaling type, computed
// with the same fp32 operations, in the same order, as transformers'
// ROPE_INIT_FUNCTIONS, so the bits agree and logits match at every position.

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "actor/model_config.h"

namespace rlmesh::actor {

struct RopeFrequencies {
  at::Tensor inv_freq;   // [HeadDim()/2] fp32
  double scaling = 1.0;  // multiplies cos and sin (yarn's attention factor)
};

// The frequencies of `config` for sequences of up to `seq_len` positions.
// Only "dynamic" depends on `seq_len`: up to max_positions it is the default
// RoPE; beyond, the base grows with the length (NTK). seq_len <= 0 means
// max_positions. REQUIRES: config.Validate().ok().
RopeFrequencies ComputeRope(const ModelConfig& config, int64_t seq_len = 0);

}  // namespace rlmesh::actor
