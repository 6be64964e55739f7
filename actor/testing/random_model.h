#pragma once
// A model for generation tests: weight matrices drawn from N(0, std^2) with
// a fixed seed (norms and biases as constructed), so that the next-token
// distribution is far from uniform and greedy and sampling tests mean
// something.

#include <torch/torch.h>

#include <cstdint>

#include "actor/transformer.h"

namespace rlmesh::actor::testing {

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
