#pragma once

// The small Llama the layout benchmarks (pipeline_bench, context_parallel_bench)
// time: SwiGLU 4x wide, 8 query heads over 4 key/value heads, shaped by
// their flags.

#include <cstdint>

#include "actor/model_config.h"

namespace rlmesh::bench {

inline actor::ModelConfig SmallLlama(int64_t vocab, int64_t hidden, int64_t layers, int64_t max_positions) {
  actor::ModelConfig c;
  c.arch = "llama";
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = 4 * hidden;
  c.num_layers = layers;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.max_positions = max_positions;
  return c;
}

}  // namespace rlmesh::bench
