// The decode step at fixed shapes (GeneratorOptions::static_decode, what CUDA
// graphs replay) against the usual one: the same tokens and log-probs under
// continuous batching, the shapes it promises, and the models it leaves to
// the usual step. (The graphs themselves: fixed_decode_gpu_test.)

#include <cmath>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/match.h"
#include "actor/fixed_decode.h"
#include "actor/generate.h"
#include "actor/testing/random_model.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"

namespace rlmesh::actor {
namespace {

ModelConfig Tiny(const std::string& arch = "llama") { return testing::TinyConfig(arch, /*max_positions=*/96); }

Transformer MakeModel(const ModelConfig& c) { return testing::RandomModel(c); }

// Records the shape of every decode step the Generator asks for.
class ShapeRecorder : public TransformerGeneration {
 public:
  explicit ShapeRecorder(Transformer m) : TransformerGeneration(m.ptr()) {}
  torch::Tensor DecodeStep(const torch::Tensor& ids, const torch::Tensor& lens, int64_t max_len,
                           KvCache* cache) override {
    steps.push_back({ids.size(0), max_len + 1, cache->capacity(), cache->rows()});
    return TransformerGeneration::DecodeStep(ids, lens, max_len, cache);
  }
  struct Shape {
    int64_t rows, attended, capacity, cache_rows;
  };
  std::vector<Shape> steps;
};

// Crowded continuous batching: prompts of several lengths, budgets and
// samples per prompt, so rows join and leave and the batch size changes
// nearly every step; greedy and sampled.
std::vector<GenerationRequest> Crowd() {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.prompt = std::vector<int64_t>(1 + 5 * i, 3 + i);
    r.prompt[0] = 40 - i;
    r.sampling.greedy = i % 2 == 0;
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 11 + i;
    r.sampling.n = 1 + i % 3;
    r.sampling.max_new_tokens = 4 + 7 * i;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<GroupResult> Run(const std::shared_ptr<ShapeRecorder>& model, GeneratorOptions o) {
  Generator gen(model, o);
  auto res = gen.Generate(Crowd());
  INFO(res.status().ToString());
  REQUIRE(res.ok());
  const DecodeGraphStats stats = gen.graph_stats();
  CHECK(stats.captures == 0);  // no graphs on the CPU
  CHECK(stats.replays == 0);
  return *res;
}

TEST_CASE("Fixed-shape decode gives the usual step's tokens and log-probs") {
  const std::string arch = GENERATE(as<std::string>{}, "llama", "qwen3");
  INFO(arch);
  ModelConfig c = Tiny(arch);
  if (arch == "qwen3") c.head_dim = 12;
  auto m = MakeModel(c);
  // max_batch 5: the buckets are 1, 2, 4 and 5 (capped, not a power of two).
  const std::vector<GroupResult> usual = Run(std::make_shared<ShapeRecorder>(m), {.max_batch = 5});
  auto shapes = std::make_shared<ShapeRecorder>(m);
  const std::vector<GroupResult> fixed = Run(shapes, {.max_batch = 5, .static_decode = true});
  REQUIRE(usual.size() == fixed.size());
  size_t tokens = 0;
  for (size_t g = 0; g < usual.size(); ++g) {
    REQUIRE(usual[g].samples.size() == fixed[g].samples.size());
    for (size_t i = 0; i < usual[g].samples.size(); ++i) {
      INFO("group " << g << " sample " << i);
      const Completion& a = usual[g].samples[i];
      const Completion& b = fixed[g].samples[i];
      CHECK(a.tokens == b.tokens);
      REQUIRE(a.logprobs.size() == b.logprobs.size());
      for (size_t t = 0; t < a.logprobs.size(); ++t) CHECK(std::abs(a.logprobs[t] - b.logprobs[t]) < 1e-5);
      tokens += a.tokens.size();
    }
  }
  CHECK(tokens > 100);
  // The promised shapes: a bucket of rows, the cache's whole capacity.
  REQUIRE(shapes->steps.size() > 20);
  std::set<int64_t> buckets;
  for (const auto& s : shapes->steps) {
    CHECK((s.rows == 1 || s.rows == 2 || s.rows == 4 || s.rows == 5));
    CHECK(s.attended == s.capacity);
    CHECK(s.cache_rows >= s.rows);
    buckets.insert(s.rows);
  }
  CHECK(buckets.size() >= 2);
}

TEST_CASE("The usual step keeps its shapes, and models with data-dependent shapes decode as usual") {
  // Dynamic RoPE picks its base from the longest position (a host read).
  ModelConfig dynamic = Tiny();
  dynamic.rope.type = "dynamic";
  dynamic.rope.factor = 2.0;
  for (const auto& [config, options] :
       std::vector<std::pair<ModelConfig, GeneratorOptions>>{{Tiny(), {.max_batch = 5}},
                                                             {dynamic, {.max_batch = 5, .static_decode = true}}}) {
    INFO("rope " << config.rope.type << " static_decode " << options.static_decode);
    auto shapes = std::make_shared<ShapeRecorder>(MakeModel(config));
    Run(shapes, options);
    bool odd_batch = false, short_attention = false;
    for (const auto& s : shapes->steps) {
      odd_batch |= s.rows == 3;
      short_attention |= s.attended < s.capacity;
    }
    // Three live rows decode as three, over the positions used so far.
    CHECK(odd_batch);
    CHECK(short_attention);
  }
}

TEST_CASE("FixedShapeDecoder buckets: powers of two up to max_batch") {
  FixedShapeDecoder d(/*max_batch=*/48, /*cuda_graphs=*/false, torch::kCPU);
  CHECK(d.Bucket(1) == 1);
  CHECK(d.Bucket(2) == 2);
  CHECK(d.Bucket(3) == 4);
  CHECK(d.Bucket(17) == 32);
  CHECK(d.Bucket(33) == 48);
  CHECK(d.Bucket(48) == 48);
}

TEST_CASE("cuda_graphs is refused by name for a model on the CPU") {
  Generator gen(MakeModel(Tiny()), {.cuda_graphs = true});
  GenerationRequest r;
  r.prompt = {1, 2};
  const absl::Status s = gen.Submit(r);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "GeneratorOptions.cuda_graphs: needs the model on a GPU (it is on cpu)"));
  CHECK(gen.Idle());
}

// Asked for graphs, a policy whose decode cannot be captured is refused, not
// decoded without them (checked before the device, so it holds here too).
TEST_CASE("cuda_graphs is refused by name for MoE and dynamic-RoPE policies") {
  ModelConfig moe = Tiny("qwen3_moe");
  moe.num_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 16;
  ModelConfig dynamic = Tiny();
  dynamic.rope.type = "dynamic";
  dynamic.rope.factor = 2.0;
  for (const auto& [config, why] :
       std::vector<std::pair<ModelConfig, std::string>>{{moe, "MoE routing"}, {dynamic, "dynamic RoPE"}}) {
    INFO(why);
    REQUIRE(config.Validate().ok());
    Generator gen(MakeModel(config), {.cuda_graphs = true});
    GenerationRequest r;
    r.prompt = {1, 2};
    const absl::Status s = gen.Submit(r);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(s.message(), "rollout.cuda_graphs"));
    CHECK(absl::StrContains(s.message(), "(" + why + ")"));
    CHECK(gen.Idle());
  }
}

}  // namespace
}  // namespace rlmesh::actor
