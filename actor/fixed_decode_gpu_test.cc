// CUDA graphs of the decode step (GeneratorOptions::cuda_graphs) on a GPU:
// the same tokens and log-probs as the eager step there, under continuous
// batching (buckets captured and replayed, recaptured as the cache grows).
// Tagged gpu + manual: scripts/device_check.sh runs it.

#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "actor/generate.h"
#include "actor/testing/random_model.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "dist/testing/require_gpus.h"

namespace rlmesh::actor {
namespace {

TEST_CASE("Decode replayed from CUDA graphs equals the eager step on the GPU", "[gpu]") {
  dist::testing::RequireGpus(1);
  ModelConfig c;
  c.arch = "qwen3";
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.max_positions = 256;
  Transformer m = testing::RandomModel(c, /*seed=*/1, /*std=*/0.2);
  m->to(torch::Device(torch::kCUDA, 0));
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.prompt = std::vector<int64_t>(1 + 9 * i, 5 + i);
    r.sampling.greedy = i % 2 == 0;
    r.sampling.seed = 3 + i;
    r.sampling.n = 1 + i % 4;
    r.sampling.max_new_tokens = 10 + 17 * i;  // the longest outgrow the first cache capacity
    reqs.push_back(std::move(r));
  }
  Generator eager(m, {.max_batch = 12});
  auto a = eager.Generate(reqs);
  REQUIRE(a.ok());
  Generator graphed(m, {.max_batch = 12, .cuda_graphs = true});
  auto b = graphed.Generate(reqs);
  REQUIRE(b.ok());
  const DecodeGraphStats stats = graphed.graph_stats();
  INFO("graph error: " << stats.error);
  CHECK(stats.error.empty());
  CHECK(stats.captures >= 3);
  CHECK(stats.replays > 50);
  for (size_t g = 0; g < reqs.size(); ++g) {
    REQUIRE((*a)[g].samples.size() == (*b)[g].samples.size());
    for (size_t i = 0; i < (*a)[g].samples.size(); ++i) {
      INFO("group " << g << " sample " << i);
      const Completion& x = (*a)[g].samples[i];
      const Completion& y = (*b)[g].samples[i];
      CHECK(x.tokens == y.tokens);
      REQUIRE(x.logprobs.size() == y.logprobs.size());
      // fp32; the fixed shapes sum attention over more (masked) positions.
      for (size_t t = 0; t < x.logprobs.size(); ++t) CHECK(std::abs(x.logprobs[t] - y.logprobs[t]) < 1e-4);
    }
  }
}

}  // namespace
}  // namespace rlmesh::actor
