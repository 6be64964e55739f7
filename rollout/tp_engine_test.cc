// A rollout engine whose model is split over tensor-parallel ranks samples
// what the whole model samples: same tokens, log-probs within 1e-5, under
// continuous batching, sampling filters, partial rollout and a weight swap.

#include "rollout/tp_engine.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "actor/generate.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "parallel/testing/model_testing.h"

namespace rlmesh::rollout {
namespace {

using parallel::model_testing::InitialWeights;
using parallel::model_testing::Named;
using parallel::model_testing::SmallConfig;

actor::Transformer WholeModel(const actor::ModelConfig& c, const Named& weights) {
  actor::Transformer m(c);
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> src(weights.begin(), weights.end());
  for (auto& [name, p] : m->NamedParameters()) p.copy_(src.at(name));
  return m;
}

// Other weights of the same shape (a "newer policy").
Named Perturbed(const Named& w) {
  at::manual_seed(11);
  Named out;
  for (const auto& [name, t] : w) out.emplace_back(name, t + 0.05 * at::randn_like(t));
  return out;
}

// Four prompts of different lengths: sampled with top-k/top-p, at a
// temperature, greedy; two samples each. max_batch 5 admits them in turns,
// so rows join while others decode and leave at stop tokens.
std::vector<actor::GenerationRequest> Requests() {
  std::vector<std::vector<int64_t>> prompts = {{7, 3, 9, 30, 2}, {41, 5}, {17, 1, 8, 44, 12, 6, 33}, {2, 2, 19}};
  std::vector<actor::GenerationRequest> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    actor::GenerationRequest r;
    r.id = 100 + i;
    r.prompt = prompts[i];
    r.prompt_index = static_cast<int64_t>(i);
    r.sampling.n = 2;
    r.sampling.seed = 3;
    r.sampling.max_new_tokens = 9;
    r.sampling.temperature = 0.8f;
    if (i == 1) r.sampling.top_p = 0.9f;
    if (i == 2) r.sampling.top_k = 5;
    if (i == 3) r.sampling.greedy = true;
    r.sampling.stop_token_ids = {13};
    out.push_back(r);
  }
  return out;
}

actor::GeneratorOptions Batching() {
  actor::GeneratorOptions o;
  o.max_batch = 5;
  return o;
}

// Submits all, steps `steps` times (all the way when < 0), returns the
// finished groups by id.
template <typename Engine>
std::map<uint64_t, actor::GroupResult> Drive(Engine& e, const std::vector<actor::GenerationRequest>& reqs,
                                             int steps = -1) {
  std::map<uint64_t, actor::GroupResult> out;
  for (const auto& r : reqs) REQUIRE(e.Submit(r).ok());
  for (int i = 0; (steps < 0 || i < steps) && !e.Idle(); ++i) {
    absl::Status s = e.Step([&](actor::GroupResult g) { out[g.id] = std::move(g); });
    INFO(s.ToString());
    REQUIRE(s.ok());
  }
  return out;
}

void CheckSame(const std::map<uint64_t, actor::GroupResult>& got,
               const std::map<uint64_t, actor::GroupResult>& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [id, w] : want) {
    CAPTURE(id);
    const actor::GroupResult& g = got.at(id);
    REQUIRE(g.samples.size() == w.samples.size());
    for (size_t i = 0; i < w.samples.size(); ++i) {
      CAPTURE(i);
      CHECK(g.samples[i].tokens == w.samples[i].tokens);
      CHECK(g.samples[i].finish_reason == w.samples[i].finish_reason);
      REQUIRE(g.samples[i].logprobs.size() == w.samples[i].logprobs.size());
      for (size_t t = 0; t < w.samples[i].logprobs.size(); ++t) {
        CHECK(std::abs(g.samples[i].logprobs[t] - w.samples[i].logprobs[t]) < 1e-5);
      }
    }
  }
}

// Resubmits aborted groups for `resume`.
std::vector<actor::GenerationRequest> Resumed(const std::vector<actor::GroupResult>& aborted) {
  std::map<uint64_t, actor::GenerationRequest> by_id;
  for (auto& r : Requests()) by_id[r.id] = r;
  std::vector<actor::GenerationRequest> out;
  for (const auto& g : aborted) {
    actor::GenerationRequest r = by_id.at(g.id);
    r.resume = g.samples;
    out.push_back(r);
  }
  return out;
}

TEST_CASE("tp=2 rollout samples the whole model's tokens and log-probs") {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    CAPTURE(arch);
    const actor::ModelConfig c = SmallConfig(arch);  // qwen2: q/k/v biases
    const Named init = InitialWeights(c);
    actor::Generator whole(WholeModel(c, init), Batching());
    const auto want = Drive(whole, Requests());

    // Not vacuous: samples differ within a group, a stop token ended one,
    // and max_batch forced some prompts to join later.
    bool differ = false, stopped = false;
    for (const auto& [id, g] : want) {
      differ |= g.samples[0].tokens != g.samples[1].tokens;
      for (const auto& s : g.samples) stopped |= s.finish_reason == actor::FinishReason::kStop;
    }
    CHECK(differ);
    CHECK(stopped);

    TensorParallelEngineOptions o;
    o.tp = 2;
    o.generator = Batching();
    auto engine = TensorParallelEngine::Create(c, o);
    INFO(engine.status().ToString());
    REQUIRE(engine.ok());
    REQUIRE((*engine)->Load(init).ok());
    // Each rank holds a slice: about half the weights (the norms are whole).
    int64_t whole_bytes = 0;
    for (const auto& [name, t] : init) whole_bytes += static_cast<int64_t>(t.nbytes());
    for (int r = 0; r < 2; ++r) CHECK((*engine)->ParameterBytes(r) < 0.55 * whole_bytes);
    CheckSame(Drive(**engine, Requests()), want);
  }
}

TEST_CASE("tp=2 rollout: a partial rollout across a weight swap equals the whole model's") {
  const actor::ModelConfig c = SmallConfig("llama");
  const Named v1 = InitialWeights(c), v2 = Perturbed(v1);

  // The whole model: 3 steps on v1, abort, continue on v2.
  actor::Generator whole(WholeModel(c, v1), Batching());
  auto want = Drive(whole, Requests(), 3);
  const std::vector<actor::GroupResult> aborted_whole = whole.Abort();
  REQUIRE(!aborted_whole.empty());
  actor::Generator whole2(WholeModel(c, v2), Batching());
  auto rest = Drive(whole2, Resumed(aborted_whole));
  want.insert(rest.begin(), rest.end());

  TensorParallelEngineOptions o;
  o.tp = 2;
  o.generator = Batching();
  auto engine = TensorParallelEngine::Create(c, o);
  REQUIRE(engine.ok());
  TensorParallelEngine& e = **engine;
  REQUIRE(e.Load(v1).ok());
  auto got = Drive(e, Requests(), 3);
  CHECK(e.Load(v2).code() == absl::StatusCode::kFailedPrecondition);  // not while running
  const std::vector<actor::GroupResult> aborted = e.Abort();
  REQUIRE(aborted.size() == aborted_whole.size());
  REQUIRE(e.Idle());
  REQUIRE(e.Load(v2).ok());
  auto got_rest = Drive(e, Resumed(aborted));
  got.insert(got_rest.begin(), got_rest.end());
  CheckSame(got, want);

  // The swap mattered: v2 alone continues differently from v1 alone.
  actor::Generator only_v1(WholeModel(c, v1), Batching());
  const auto straight = Drive(only_v1, Requests());
  bool changed = false;
  for (const auto& [id, g] : straight) {
    for (size_t i = 0; i < g.samples.size(); ++i) changed |= g.samples[i].tokens != want.at(id).samples[i].tokens;
  }
  CHECK(changed);
}

TEST_CASE("tp rollout: bad shapes and requests are refused by name") {
  actor::ModelConfig c = SmallConfig("llama");
  TensorParallelEngineOptions o;
  o.tp = 4;  // 2 KV heads over 4 ranks
  auto refused = TensorParallelEngine::Create(c, o);
  REQUIRE(!refused.ok());
  CHECK(refused.status().message().find("num_kv_heads") != std::string::npos);
  o.tp = 0;
  CHECK(TensorParallelEngine::Create(c, o).status().message().find("tp") != std::string::npos);

  o.tp = 2;
  auto e = TensorParallelEngine::Create(c, o);
  REQUIRE(e.ok());
  Named w = InitialWeights(c);
  w.pop_back();
  absl::Status load = (*e)->Load(w);
  CHECK(load.code() == absl::StatusCode::kInvalidArgument);
  actor::GenerationRequest bad = Requests()[0];
  bad.prompt = {c.vocab_size};
  absl::Status s = (*e)->Submit(bad);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("request.prompt[0]") != std::string::npos);
  CHECK((*e)->Idle());  // no rank kept it
}

}  // namespace
}  // namespace rlmesh::rollout
