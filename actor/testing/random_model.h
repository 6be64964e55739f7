#pragma once
// Models for generation tests: a tiny shape, and weight matrices drawn from
// N(0, std^2) with a fixed seed (norms and biases as constructed), so that
// the next-token distribution is far from uniform and greedy and sampling
// tests mean something.

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "actor/transformer.h"

namespace rlmesh::actor::testing {

// Vocabulary 50, hidden 32, MLP 64, 2 layers, 4 heads over 2 KV heads.
inline ModelConfig TinyConfig(const std::string& arch, int max_positions) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = max_positions;
  return c;
}

inline Transformer RandomModel(const ModelConfig& config, uint64_t seed = 1, double std = 0.3) {
  torch::manual_seed(seed);
  Transformer m(config);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) {
    if (p.dim() >= 2) p.normal_(0, std);
  }
  return m;
}

}  // namespace rlmesh::actor::testing
