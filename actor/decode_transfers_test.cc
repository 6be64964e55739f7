// The generation loop's host<->device copies (DecodeTransfers): one each way
// per decode step and per admission, whatever the batch does. On a GPU each
// copy is a synchronisation, so a second copy per step costs a wait per
// token; on the CPU the copies are no-ops, and the loop's count is what a
// test can hold it to.

#include <cstdint>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "actor/generate.h"
#include "actor/testing/random_model.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"

namespace rlmesh::actor {
namespace {

// Greedy, sampled, top-k and top-p rows of several lengths and budgets, n
// samples each, so that rows finish at different steps.
std::vector<GenerationRequest> Mixed(int count) {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < count; ++i) {
    GenerationRequest r;
    r.prompt = std::vector<int64_t>(1 + 3 * i, 3 + i);
    r.sampling.greedy = i % 4 == 0;
    r.sampling.temperature = 0.7f + 0.1f * i;
    r.sampling.top_k = i % 4 == 1 ? 5 : 0;
    r.sampling.top_p = i % 4 == 2 ? 0.8f : 1.0f;
    r.sampling.seed = 3 + i;
    r.sampling.n = 1 + i % 3;
    r.sampling.max_new_tokens = 6 + 5 * i;
    out.push_back(std::move(r));
  }
  return out;
}

DecodeTransfers Minus(const DecodeTransfers& a, const DecodeTransfers& b) {
  return {a.decode_steps - b.decode_steps, a.admissions - b.admissions, a.host_to_device - b.host_to_device,
          a.device_to_host - b.device_to_host};
}

// Steps `gen` through `requests` until idle, checking every Step's copies:
// `h2d_per_decode` host->device and one device->host per decode step, one
// of each per admission. Returns the totals.
DecodeTransfers StepAndCount(Generator& gen, std::vector<GenerationRequest> requests, int64_t h2d_per_decode) {
  torch::NoGradGuard no_grad;
  for (auto& r : requests) REQUIRE(gen.Submit(std::move(r)).ok());
  int64_t groups = 0, tokens = 0;
  while (!gen.Idle()) {
    const DecodeTransfers before = gen.transfers();
    const bool decodes = gen.running() > 0;
    REQUIRE(gen.Step([&](GroupResult g) {
              ++groups;
              for (const auto& c : g.samples) tokens += static_cast<int64_t>(c.tokens.size());
            }).ok());
    const DecodeTransfers d = Minus(gen.transfers(), before);
    INFO("decode steps " << d.decode_steps << " admissions " << d.admissions);
    CHECK(d.decode_steps == (decodes ? 1 : 0));
    CHECK(d.admissions <= 1);
    CHECK(d.host_to_device == h2d_per_decode * d.decode_steps + d.admissions);
    CHECK(d.device_to_host == d.decode_steps + d.admissions);
  }
  CHECK(groups > 0);
  CHECK(tokens > gen.transfers().decode_steps);  // several rows share each step's copies
  return gen.transfers();
}

ModelConfig Tiny() { return testing::TinyConfig("llama", /*max_positions=*/96); }

TEST_CASE("one copy each way per decode step and per admission, all rows admitted at once") {
  Generator gen(testing::RandomModel(Tiny()));
  const DecodeTransfers t = StepAndCount(gen, Mixed(6), 1);
  CHECK(t.admissions == 1);
  CHECK(t.decode_steps == 6 + 5 * 5 - 1);  // the longest budget; its first token came from the prefill
  CHECK(t.host_to_device == t.decode_steps + 1);
  CHECK(t.device_to_host == t.decode_steps + 1);
}

TEST_CASE("continuous batching: rows join and leave between steps, still one copy each way per step") {
  GeneratorOptions o;
  o.max_batch = 4;  // the queue waits for rows to finish
  Generator gen(testing::RandomModel(Tiny()), o);
  const DecodeTransfers t = StepAndCount(gen, Mixed(8), 1);
  CHECK(t.admissions > 2);
}

TEST_CASE("MoE routes come back with the tokens, in the same copy") {
  ModelConfig c = testing::TinyConfig("qwen3_moe", 96);
  c.num_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  GeneratorOptions o;
  o.record_routing = true;
  o.max_batch = 5;
  Generator gen(testing::RandomModel(c), o);
  StepAndCount(gen, Mixed(5), 1);
}

TEST_CASE("static_decode: FixedShapeDecoder::Step's own copies of ids and lens are counted") {
  GeneratorOptions o;
  o.static_decode = true;
  Generator gen(testing::RandomModel(Tiny()), o);
  StepAndCount(gen, Mixed(4), 3);
}

TEST_CASE("SampleTokens (one upload, one read) gives what the Generator's rows get") {
  // The public sampler and the loop share SampleOnDevice; a greedy row is
  // the argmax and its log-prob the log-softmax at it.
  torch::manual_seed(5);
  auto logits = torch::randn({3, 50}) * 2;
  SamplingOptions greedy, hot, topk;
  greedy.greedy = true;
  hot.temperature = 1.5f;
  topk.top_k = 1;
  std::vector<int64_t> tok;
  std::vector<float> lp;
  SampleTokens(logits, {&greedy, &hot, &topk}, {0.3, 0.6, 0.9}, &tok, &lp);
  CHECK(tok[0] == logits[0].argmax().item<int64_t>());
  CHECK(lp[0] == torch::log_softmax(logits[0], -1)[tok[0]].item<float>());
  CHECK(tok[2] == logits[2].argmax().item<int64_t>());  // top-1 leaves the argmax only
  CHECK(lp[1] == torch::log_softmax(logits[1] * (1.0f / 1.5f), -1)[tok[1]].item<float>());
}

}  // namespace
}  // namespace rlmesh::actor
