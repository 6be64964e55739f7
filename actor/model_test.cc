// (Over 600 lines: one test per model feature, sharing the tiny-model setup.)
// Transformer, chunked log-probs and generation against the model's own
// full-recompute forward (parity with transformers is in checkpoint_test).

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <torch/torch.h>

#include "actor/generate.h"
#include "actor/logprobs.h"
#include "actor/testing/random_model.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"

namespace rlmesh::actor {
namespace {

ModelConfig Tiny(const std::string& arch = "llama", bool tie = false) {
  ModelConfig c = testing::TinyConfig(arch, /*max_positions=*/64);
  c.tie_embeddings = tie;
  return c;
}

Transformer MakeModel(const ModelConfig& c, uint64_t seed = 1) { return testing::RandomModel(c, seed); }

torch::Tensor Positions(int64_t B, int64_t T) { return torch::arange(T).unsqueeze(0).expand({B, T}).contiguous(); }

TEST_CASE("Parameters carry Hugging Face names") {
  auto m = MakeModel(Tiny("qwen2", /*tie=*/false));
  std::set<std::string> names;
  for (auto& [n, p] : m->NamedParameters()) names.insert(n);
  CHECK(names.count("model.embed_tokens.weight"));
  CHECK(names.count("model.layers.1.self_attn.q_proj.bias"));
  CHECK(names.count("model.layers.0.self_attn.k_proj.weight"));
  CHECK(names.count("model.layers.0.mlp.gate_proj.weight"));
  CHECK(names.count("model.layers.1.post_attention_layernorm.weight"));
  CHECK(names.count("model.norm.weight"));
  CHECK(names.count("lm_head.weight"));
  CHECK(names.size() == 1 + 2 * 12 + 1 + 1);
  auto tied = MakeModel(Tiny("llama", true));
  for (auto& [n, p] : tied->NamedParameters()) {
    CHECK(n != "lm_head.weight");
    CHECK(n.find("bias") == std::string::npos);
  }
}

TEST_CASE("Padding mask: padded rows give the unpadded outputs") {
  auto m = MakeModel(Tiny());
  torch::NoGradGuard g;
  auto ids = torch::randint(0, 50, {1, 7});
  auto ref = m->Forward(ids, Positions(1, 7));
  // Left padding by 3 with positions starting at 0 on the first real token.
  auto padded = torch::cat({torch::zeros({1, 3}, torch::kLong), ids}, 1);
  auto pos = torch::cat({torch::zeros({1, 3}, torch::kLong), torch::arange(7).unsqueeze(0)}, 1);
  auto mask = torch::cat({torch::zeros({1, 3}), torch::ones({1, 7})}, 1);
  auto out = m->Logits(m->ForwardHidden(padded, pos, mask)).narrow(1, 3, 7);
  CHECK((out - ref).abs().max().item<float>() < 1e-5);
  CHECK_FALSE(out.isnan().any().item<bool>());
}

TEST_CASE("Packing: segment ids keep packed sequences apart (each equals its own unpacked forward)") {
  auto m = MakeModel(Tiny());
  torch::NoGradGuard g;
  auto a = torch::randint(0, 50, {1, 5}), b = torch::randint(0, 50, {1, 4});
  auto ref_a = m->Forward(a, Positions(1, 5)), ref_b = m->Forward(b, Positions(1, 4));
  // One row: a, b, then 2 pad; positions restart at b.
  auto ids = torch::cat({a, b, torch::zeros({1, 2}, torch::kLong)}, 1);
  auto pos = torch::cat({torch::arange(5), torch::arange(4), torch::zeros({2}, torch::kLong)}).unsqueeze(0);
  auto seg = torch::tensor({1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0}, torch::kLong).unsqueeze(0);
  auto out = m->Logits(m->ForwardHidden(ids, pos, seg));
  CHECK((out.narrow(1, 0, 5) - ref_a).abs().max().item<float>() < 1e-5);
  CHECK((out.narrow(1, 5, 4) - ref_b).abs().max().item<float>() < 1e-5);
  CHECK_FALSE(out.isnan().any().item<bool>());
  // Without the segment ids b would attend to a.
  auto leaky = m->Logits(m->ForwardHidden(ids, pos, (seg > 0).to(torch::kFloat)));
  CHECK((leaky.narrow(1, 5, 4) - ref_b).abs().max().item<float>() > 1e-3);
}

TEST_CASE("Value head gives one scalar per position") {
  auto c = Tiny();
  c.value_head = true;
  auto m = MakeModel(c);
  auto v = m->Values(torch::randint(0, 50, {2, 5}), Positions(2, 5));
  CHECK(v.sizes() == torch::IntArrayRef({2, 5}));
  bool has_score = false;
  for (auto& [n, p] : m->NamedParameters()) has_score |= (n == "score.weight" && p.size(0) == 1);
  CHECK(has_score);
}

TEST_CASE("Chunked log-probs equal the full log-softmax, values and gradients") {
  for (bool tie : {false, true}) {
    for (double temp : {1.0, 0.7}) {
      INFO("tie=" << tie << " temperature=" << temp);
      auto m = MakeModel(Tiny("qwen2", tie), 3);
      const int64_t B = 2, T = 11;
      auto ids = torch::randint(0, 50, {B, T});
      auto pos = Positions(B, T);
      auto targets = torch::randint(0, 50, {B, T});
      targets.index_put_({0, 4}, -1);
      auto wl = torch::randn({B, T});
      auto we = torch::randn({B, T});

      m->zero_grad();
      auto logp = torch::log_softmax(m->Forward(ids, pos) / temp, -1);
      auto ref_lp = logp.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) * targets.ge(0);
      auto ref_ent = -(logp.exp() * logp).sum(-1);
      ((ref_lp * wl).sum() + (ref_ent * we).sum()).backward();
      std::map<std::string, torch::Tensor> ref_grad;
      for (auto& [n, p] : m->NamedParameters()) ref_grad[n] = p.grad().clone();

      m->zero_grad();
      auto out = TokenLogProbs(m, ids, pos, targets, /*chunk_size=*/3, temp);
      REQUIRE(out.ok());
      CHECK((out->logprobs - ref_lp).abs().max().item<float>() < 1e-5);
      CHECK((out->entropy - ref_ent).abs().max().item<float>() < 1e-5);
      CHECK(out->logprobs[0][4].item<float>() == 0.0f);
      ((out->logprobs * wl).sum() + (out->entropy * we).sum()).backward();
      for (auto& [n, p] : m->NamedParameters()) {
        INFO(n);
        REQUIRE(p.grad().defined());
        float scale = ref_grad[n].abs().max().item<float>() + 1e-6f;
        CHECK((p.grad() - ref_grad[n]).abs().max().item<float>() / scale < 1e-4);
      }
    }
  }
}

TEST_CASE("TokenLogProbs rejects bad input by name") {
  auto m = MakeModel(Tiny());
  auto ids = torch::randint(0, 50, {2, 4});
  auto bad = TokenLogProbs(m, ids, Positions(2, 4), torch::zeros({2, 5}, torch::kLong), 2);
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("targets") != std::string::npos);
  CHECK(TokenLogProbs(m, ids, Positions(2, 4), ids, 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(TokenLogProbs(m, ids, Positions(2, 4), ids, 2, -1.0).status().code() == absl::StatusCode::kInvalidArgument);
  auto oov = TokenLogProbs(m, ids + 100, Positions(2, 4), ids, 2);
  REQUIRE_FALSE(oov.ok());
  CHECK(std::string(oov.status().message()).find("input_ids") != std::string::npos);
}

GenerationRequest Req(std::vector<int64_t> prompt, SamplingOptions s, int64_t prompt_index = -1, uint64_t id = 0) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling = std::move(s);
  r.prompt_index = prompt_index;
  r.id = id;
  return r;
}

TEST_CASE("KV-cache generation equals full recompute (tokens and behaviour log-probs)") {
  // Qwen2 (q/k/v bias), Qwen3 (QK-norm, head_dim != hidden / heads, o bias)
  // and a YaRN-scaled Llama whose sequences outgrow the original context.
  const std::string variant = GENERATE(as<std::string>{}, "qwen2", "qwen3", "llama_yarn");
  INFO("variant " << variant);
  ModelConfig c = Tiny(variant == "llama_yarn" ? "llama" : variant);
  if (variant == "qwen3") {
    c.head_dim = 12;
    c.qkv_bias = true;
  } else if (variant == "llama_yarn") {
    c.rope.type = "yarn";
    c.rope.factor = 4;
    c.rope.original_max_positions = 8;
  }
  auto m = MakeModel(c);
  Generator gen(m, {.max_batch = 8});
  SamplingOptions greedy;
  greedy.greedy = true;
  greedy.max_new_tokens = 12;
  SamplingOptions sample;
  sample.temperature = 0.7f;
  sample.max_new_tokens = 12;
  sample.seed = 5;
  sample.n = 2;
  std::vector<std::vector<int64_t>> prompts = {{3}, {4, 9, 17, 1, 30}, {11, 12, 13, 14, 15, 16, 17, 18, 19}};
  std::vector<GenerationRequest> reqs;
  for (auto& p : prompts) reqs.push_back(Req(p, greedy));
  for (auto& p : prompts) reqs.push_back(Req(p, sample));
  auto res = gen.Generate(reqs);
  REQUIRE(res.ok());
  torch::NoGradGuard g;
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (const auto& c : (*res)[i].samples) {
      INFO("request " << i << " sample " << c.sample_index);
      REQUIRE(c.tokens.size() == 12);
      CHECK(c.finish_reason == FinishReason::kLength);
      std::vector<int64_t> seq = reqs[i].prompt;
      seq.insert(seq.end(), c.tokens.begin(), c.tokens.end());
      const int64_t T = static_cast<int64_t>(seq.size());
      auto ids = torch::tensor(seq).unsqueeze(0);
      auto logits = m->Forward(ids, Positions(1, T))[0];
      const double temp = reqs[i].sampling.greedy ? 1.0 : reqs[i].sampling.temperature;
      auto logp = torch::log_softmax(logits / temp, -1);
      const int64_t P = static_cast<int64_t>(reqs[i].prompt.size());
      for (size_t t = 0; t < c.tokens.size(); ++t) {
        auto row = logp[P - 1 + t];
        if (reqs[i].sampling.greedy) CHECK(row.argmax().item<int64_t>() == c.tokens[t]);
        CHECK(std::abs(row[c.tokens[t]].item<float>() - c.logprobs[t]) < 1e-4);
      }
      // The learner's recomputation agrees with the behaviour log-probs.
      auto targets = torch::full({1, T}, -1, torch::kLong);
      for (int64_t t = P - 1; t < T - 1; ++t) targets[0][t] = seq[t + 1];
      auto lp = TokenLogProbs(m, ids, Positions(1, T), targets, 4, temp);
      REQUIRE(lp.ok());
      for (size_t t = 0; t < c.tokens.size(); ++t) {
        CHECK(std::abs(lp->logprobs[0][P - 1 + t].item<float>() - c.logprobs[t]) < 1e-4);
      }
    }
  }
  // The n samples of a request drew from different streams.
  CHECK((*res)[4].samples[0].tokens != (*res)[4].samples[1].tokens);
}

TEST_CASE("MoE routing replay: the rollout's recorded experts give its log-probs back") {
  ModelConfig c = Tiny("qwen3_moe");
  c.num_experts = 6;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  auto m = MakeModel(c, 4);
  {
    torch::NoGradGuard g;
    // Router logits large enough that routes are decisive yet not trivial.
    for (auto& p : m->named_parameters()) {
      if (p.key().find("mlp.gate.") != std::string::npos) p.value().normal_(0, 1.0);
    }
  }
  Generator gen(m, {.max_batch = 8, .record_routing = true});
  SamplingOptions sample;
  sample.temperature = 1.0f;
  sample.max_new_tokens = 10;
  sample.seed = 9;
  sample.n = 3;
  auto res = gen.Generate({Req({3, 14, 15, 9}, sample), Req({26, 5}, sample)});
  REQUIRE(res.ok());
  const int64_t per_pos = c.NumMoeLayers() * c.num_experts_per_tok;
  REQUIRE(per_pos == c.num_layers * 2);  // every layer is MoE (decoder_sparse_step 1)
  // The rollout's weights moved a little (as after an update, or another
  // precision): free routing now differs somewhere; replay does not.
  auto moved = MakeModel(c, 4);
  {
    torch::NoGradGuard g;
    auto src = m->NamedParameters();
    auto dst = moved->NamedParameters();
    torch::manual_seed(77);
    for (size_t i = 0; i < src.size(); ++i) {
      dst[i].second.copy_(src[i].second);
      if (dst[i].first.find("mlp.gate.") != std::string::npos) dst[i].second.add_(torch::randn_like(dst[i].second) * 0.2);
    }
  }
  int flips = 0;
  for (size_t q = 0; q < res->size(); ++q) {
    for (const auto& s : (*res)[q].samples) {
      const std::vector<int64_t>& prompt = q == 0 ? std::vector<int64_t>{3, 14, 15, 9} : std::vector<int64_t>{26, 5};
      std::vector<int64_t> seq = prompt;
      seq.insert(seq.end(), s.tokens.begin(), s.tokens.end());
      const int64_t T = static_cast<int64_t>(seq.size());
      INFO("request " << q << " sample " << s.sample_index);
      // Every position the model ran: the prompt and all tokens but the last.
      REQUIRE(static_cast<int64_t>(s.routes.size()) == (T - 1) * per_pos);
      auto ids = torch::tensor(seq).unsqueeze(0);
      auto targets = torch::full({1, T}, -1, torch::kLong);
      const int64_t P = static_cast<int64_t>(prompt.size());
      for (int64_t t = P - 1; t < T - 1; ++t) targets[0][t] = seq[t + 1];
      MoeRouting replay;
      replay.replay = RoutesToReplay({s.routes}, T, c);
      replay.record = true;
      for (Transformer* model : {&m, &moved}) {
        (*model)->set_routing(&replay);
        auto lp = TokenLogProbs(*model, ids, Positions(1, T), targets, 4, 1.0);
        (*model)->set_routing(nullptr);
        REQUIRE(lp.ok());
        // The replayed forward used exactly the rollout's experts.
        auto used = torch::stack(replay.chosen, 1).reshape({T, -1}).narrow(0, 0, T - 1).to(torch::kInt32).contiguous();
        CHECK(std::vector<int32_t>(used.data_ptr<int32_t>(), used.data_ptr<int32_t>() + used.numel()) == s.routes);
        if (model == &m) {
          // On the rollout's own weights: the rollout's log-probs.
          for (size_t t = 0; t < s.tokens.size(); ++t) {
            CHECK(std::abs(lp->logprobs[0][P - 1 + t].item<float>() - s.logprobs[t]) < 1e-5);
          }
        }
      }
      // Free routing on the moved weights picks other experts somewhere.
      MoeRouting free;
      free.record = true;
      moved->set_routing(&free);
      {
        torch::NoGradGuard g;
        moved->Forward(ids, Positions(1, T));
      }
      moved->set_routing(nullptr);
      auto chosen = torch::stack(free.chosen, 1).reshape({T, -1}).narrow(0, 0, T - 1).to(torch::kInt32).contiguous();
      flips += std::vector<int32_t>(chosen.data_ptr<int32_t>(), chosen.data_ptr<int32_t>() + chosen.numel()) != s.routes;
    }
  }
  CHECK(flips > 0);
  // Malformed replays are refused, not crashed on.
  MoeRouting bad;
  bad.replay = {torch::full({2, 2}, 7, torch::kLong)};
  m->set_routing(&bad);
  CHECK_THROWS(m->Forward(torch::zeros({1, 2}, torch::kLong), Positions(1, 2)));
  m->set_routing(nullptr);
}

TEST_CASE("record_routing per request: only the requests that ask get routes, the same as recording all") {
  ModelConfig c = Tiny("qwen3_moe");
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  auto m = MakeModel(c, 4);
  SamplingOptions s;
  s.max_new_tokens = 5;
  s.seed = 3;
  s.n = 2;
  GenerationRequest asked = Req({3, 14, 15}, s, 0);
  asked.record_routing = true;
  Generator gen(m, {.max_batch = 8});
  auto res = gen.Generate({asked, Req({26, 5}, s, 1)});
  REQUIRE(res.ok());
  Generator all(m, {.max_batch = 8, .record_routing = true});
  auto ref = all.Generate({Req({3, 14, 15}, s, 0), Req({26, 5}, s, 1)});
  REQUIRE(ref.ok());
  const size_t per_pos = static_cast<size_t>(c.NumMoeLayers() * c.num_experts_per_tok);
  for (int i = 0; i < 2; ++i) {
    const Completion& a = (*res)[0].samples[i];
    CHECK(a.routes.size() == (3 + a.tokens.size() - 1) * per_pos);
    CHECK(a.routes == (*ref)[0].samples[i].routes);
    CHECK((*res)[1].samples[i].routes.empty());
    CHECK_FALSE((*ref)[1].samples[i].routes.empty());
  }
}

TEST_CASE("LoadBalancingLoss equals the hand-computed Switch loss, masked tokens left out") {
  const double l3 = std::log(3.0);
  // Two experts, top-1. Layer 0: tokens 0 and 2 give expert 0 probability
  // 0.75, token 1 gives it 0.25; layer 1: every token gives it 0.25.
  auto l0 = torch::tensor({l3, 0.0, 0.0, l3, l3, 0.0}, torch::kFloat).view({3, 2});
  auto l1 = torch::tensor({0.0, l3, 0.0, l3, 0.0, l3}, torch::kFloat).view({3, 2});
  // All 6 (token, layer) rows: top-1 fractions (2/6, 4/6), mean
  // probabilities (2.5/6, 3.5/6); 2 * (2 * 2.5 + 4 * 3.5) / 36.
  CHECK(LoadBalancingLoss({l0, l1}, 2, 1).item<double>() == Approx(38.0 / 36).epsilon(1e-6));
  // Token 2 masked out: fractions (1/4, 3/4), probabilities (1.5/4, 2.5/4);
  // 2 * (1 * 1.5 + 3 * 2.5) / 16.
  CHECK(LoadBalancingLoss({l0, l1}, 2, 1, torch::tensor({1.0f, 1.0f, 0.0f})).item<double>() ==
        Approx(18.0 / 16).epsilon(1e-6));
}

TEST_CASE("A seeded sample does not depend on the batch around it") {
  auto m = MakeModel(Tiny());
  SamplingOptions s;
  s.temperature = 1.0f;
  s.top_p = 0.95f;
  s.top_k = 20;
  s.max_new_tokens = 15;
  s.seed = 1234;
  s.n = 3;
  auto target = Req({5, 6, 7, 8}, s, /*prompt_index=*/42, /*id=*/99);
  Generator alone(m, {.max_batch = 3});
  auto a = alone.Generate({target});
  REQUIRE(a.ok());

  // Crowded: a tight batch limit, other prompts of other lengths before and
  // after, so the target joins late and its neighbours leave around it.
  Generator crowded(m, {.max_batch = 5});
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    SamplingOptions o = s;
    o.max_new_tokens = 3 + 4 * i;
    o.seed = 7 + i;
    o.n = 1 + (i % 2);
    reqs.push_back(Req(std::vector<int64_t>(1 + 3 * i, 9 + i), o, i));
  }
  reqs.push_back(target);
  reqs.push_back(Req({1, 2}, s, 3));
  auto b = crowded.Generate(reqs);
  REQUIRE(b.ok());
  const auto& x = (*a)[0];
  const auto& y = (*b)[4];
  CHECK(y.id == 99);
  CHECK(y.prompt_index == 42);
  REQUIRE(x.samples.size() == 3);
  REQUIRE(y.samples.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(x.samples[i].tokens == y.samples[i].tokens);
    for (size_t t = 0; t < x.samples[i].logprobs.size(); ++t) {
      CHECK(std::abs(x.samples[i].logprobs[t] - y.samples[i].logprobs[t]) < 1e-5);
    }
  }
  // A different seed changes the draw.
  auto other = target;
  other.sampling.seed = 1235;
  Generator again(m, {.max_batch = 3});
  auto c = again.Generate({other});
  REQUIRE(c.ok());
  bool differs = false;
  for (int i = 0; i < 3; ++i) differs |= (*c)[0].samples[i].tokens != x.samples[i].tokens;
  CHECK(differs);
}

TEST_CASE("top-k and top-p keep the right tokens") {
  auto logits = torch::tensor({2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 3.0f});
  auto p = torch::softmax(logits, -1);
  SamplingOptions o;
  o.top_k = 2;
  auto d = SamplingDistribution(logits, o);
  // Kept: ids 5 and 0, renormalised.
  CHECK(d[1].item<float>() == 0.0f);
  CHECK(d[4].item<float>() == 0.0f);
  CHECK(std::abs(d[5].item<float>() - p[5].item<float>() / (p[5] + p[0]).item<float>()) < 1e-6);
  CHECK(std::abs(d.sum().item<float>() - 1.0f) < 1e-6);
  o = SamplingOptions();
  // p sorted: id5 .605, id0 .222, id1 .082, id2 .050, id3 .030, id4 .011.
  o.top_p = 0.8f;  // mass before id0 is .605 < .8, before id1 .827 >= .8
  d = SamplingDistribution(logits, o);
  CHECK(d[5].item<float>() > 0);
  CHECK(d[0].item<float>() > 0);
  CHECK(d[1].item<float>() == 0.0f);
  o.top_p = 0.85f;  // now id1 is in, id2 (mass before .909) is out
  d = SamplingDistribution(logits, o);
  CHECK(d[1].item<float>() > 0);
  CHECK(d[2].item<float>() == 0.0f);
  CHECK(std::abs(d[1].item<float>() - p[1].item<float>() / (p[5] + p[0] + p[1]).item<float>()) < 1e-6);
  o.top_p = 0.5f;  // the top token alone
  d = SamplingDistribution(logits, o);
  CHECK(d[5].item<float>() == 1.0f);

  // Inverse-CDF sampling over an evenly spaced grid of uniforms reproduces
  // the filtered distribution (and never picks a filtered-out token).
  o = SamplingOptions();
  o.top_k = 4;
  o.top_p = 0.9f;
  o.temperature = 1.3f;
  auto want = SamplingDistribution(logits, o);
  const int n = 2000;
  std::vector<const SamplingOptions*> opts(n, &o);
  std::vector<double> u(n);
  for (int i = 0; i < n; ++i) u[i] = (i + 0.5) / n;
  std::vector<int64_t> tok;
  std::vector<float> lp;
  SampleTokens(logits.unsqueeze(0).expand({n, 6}), opts, u, &tok, &lp);
  std::vector<int> count(6, 0);
  for (int64_t t : tok) ++count[t];
  auto full = torch::log_softmax(logits / 1.3f, -1);
  for (int v = 0; v < 6; ++v) {
    INFO("token " << v);
    CHECK(std::abs(count[v] / double(n) - want[v].item<float>()) < 1.5 / n);
  }
  // Behaviour log-probs are of the unfiltered tempered distribution.
  CHECK(std::abs(lp[0] - full[tok[0]].item<float>()) < 1e-6);
}

TEST_CASE("Stop tokens and finish reasons") {
  auto m = MakeModel(Tiny());
  SamplingOptions g;
  g.greedy = true;
  g.max_new_tokens = 8;
  Generator gen(m);
  auto base = gen.Generate({Req({1, 2, 3}, g)});
  REQUIRE(base.ok());
  auto toks = (*base)[0].samples[0].tokens;
  CHECK((*base)[0].samples[0].finish_reason == FinishReason::kLength);
  REQUIRE(toks.size() == 8);
  // Stop at the first occurrence of the 4th token; the stop token is kept.
  size_t first = std::find(toks.begin(), toks.end(), toks[3]) - toks.begin();
  auto s = g;
  s.stop_token_ids = {toks[3], 49};
  auto stopped = gen.Generate({Req({1, 2, 3}, s)});
  REQUIRE(stopped.ok());
  const auto& c = (*stopped)[0].samples[0];
  CHECK(c.finish_reason == FinishReason::kStop);
  CHECK(c.tokens.size() == first + 1);
  CHECK(std::equal(c.tokens.begin(), c.tokens.end(), toks.begin()));
  // A stop sequence (tokens 3..4) ends it where the sequence first ends
  // (multi-turn tool-call markers); a longer, absent one changes nothing.
  size_t seq_end = 2;
  while (!(toks[seq_end - 2] == toks[3] && toks[seq_end - 1] == toks[4])) ++seq_end;
  auto q = g;
  q.stop_sequences = {{toks[3], toks[4]}, {99, 98, 97}};
  auto seq = gen.Generate({Req({1, 2, 3}, q)});
  REQUIRE(seq.ok());
  CHECK((*seq)[0].samples[0].finish_reason == FinishReason::kStop);
  CHECK((*seq)[0].samples[0].tokens.size() == seq_end);
  q.stop_sequences = {{}};
  CHECK(q.Validate().message() == "sampling.stop_sequences[0]: must not be empty");
  // Context: max_positions 64, prompt 60 -> 4 tokens.
  auto ctx = gen.Generate({Req(std::vector<int64_t>(60, 7), g), Req(std::vector<int64_t>(64, 7), g)});
  REQUIRE(ctx.ok());
  CHECK((*ctx)[0].samples[0].finish_reason == FinishReason::kContext);
  CHECK((*ctx)[0].samples[0].tokens.size() == 4);
  CHECK((*ctx)[1].samples[0].finish_reason == FinishReason::kContext);
  CHECK((*ctx)[1].samples[0].tokens.empty());
  CHECK(std::string(FinishReasonName(FinishReason::kStop)) == "stop");
}

TEST_CASE("Continuous batching streams groups as they finish") {
  auto m = MakeModel(Tiny());
  Generator gen(m, {.max_batch = 4});
  for (int i = 0; i < 10; ++i) {
    SamplingOptions s;
    s.seed = i;
    s.n = 2;
    s.max_new_tokens = 2 + (i * 7) % 11;
    REQUIRE(gen.Submit(Req(std::vector<int64_t>(1 + i % 5, i), s, i, 100 + i)).ok());
  }
  std::vector<GroupResult> got;
  int streamed_while_busy = 0;
  int steps = 0;
  int64_t max_running = 0;
  while (!gen.Idle() && steps < 1000) {
    REQUIRE(gen.Step([&](GroupResult r) {
      if (!gen.Idle()) ++streamed_while_busy;
      got.push_back(std::move(r));
    }).ok());
    max_running = std::max(max_running, gen.running());
    ++steps;
  }
  REQUIRE(gen.Idle());
  REQUIRE(got.size() == 10);
  CHECK(max_running <= 4);
  CHECK(streamed_while_busy >= 5);
  for (const auto& g : got) {
    REQUIRE(g.samples.size() == 2);
    int i = static_cast<int>(g.id - 100);
    for (int k = 0; k < 2; ++k) {
      CHECK(g.samples[k].sample_index == k);
      CHECK(static_cast<int>(g.samples[k].tokens.size()) == 2 + (i * 7) % 11);
    }
  }
  // Far fewer steps than running every request one after another.
  CHECK(steps < 60);
}

TEST_CASE("Abort then resume (partial rollout) on the same weights equals an uninterrupted run") {
  auto m = MakeModel(Tiny());
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    SamplingOptions s;
    s.seed = 50 + i;
    s.n = 2 + i % 2;
    s.top_k = 10;
    s.max_new_tokens = 6 + 3 * i;
    s.stop_token_ids = {3};
    reqs.push_back(Req(std::vector<int64_t>(2 + i, 10 + i), s, i, 200 + i));
  }
  Generator whole(m, {.max_batch = 6});
  auto want = whole.Generate(reqs);
  REQUIRE(want.ok());

  // Interrupt after a few steps: some groups are done, some running (some of
  // their samples finished), some still queued (max_batch 6).
  Generator first(m, {.max_batch = 6});
  for (const auto& r : reqs) REQUIRE(first.Submit(r).ok());
  std::map<uint64_t, GroupResult> got;
  auto collect = [&](GroupResult g) { got[g.id] = std::move(g); };
  for (int step = 0; step < 4; ++step) REQUIRE(first.Step(collect).ok());
  std::vector<GroupResult> partial = first.Abort();
  CHECK(first.Idle());
  REQUIRE(!partial.empty());
  CHECK(got.size() + partial.size() == reqs.size());
  bool some_tokens = false, some_untouched = false;
  Generator second(m, {.max_batch = 6});
  for (const auto& p : partial) {
    GenerationRequest r = reqs[p.id - 200];
    REQUIRE(p.samples.size() == static_cast<size_t>(r.sampling.n));
    for (const auto& c : p.samples) {
      if (c.finish_reason == FinishReason::kAborted) {
        some_tokens |= !c.tokens.empty();
        some_untouched |= c.tokens.empty();
      }
    }
    r.resume = p.samples;
    REQUIRE(second.Submit(r).ok());
  }
  CHECK(some_tokens);
  CHECK(some_untouched);
  REQUIRE(second.RunUntilIdle(collect).ok());
  REQUIRE(got.size() == reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GroupResult& a = (*want)[i];
    const GroupResult& b = got.at(200 + i);
    REQUIRE(a.samples.size() == b.samples.size());
    for (size_t k = 0; k < a.samples.size(); ++k) {
      INFO("request " << i << " sample " << k);
      CHECK(a.samples[k].tokens == b.samples[k].tokens);
      CHECK(a.samples[k].finish_reason == b.samples[k].finish_reason);
      REQUIRE(a.samples[k].logprobs.size() == b.samples[k].logprobs.size());
      for (size_t t = 0; t < a.samples[k].logprobs.size(); ++t) {
        CHECK(std::abs(a.samples[k].logprobs[t] - b.samples[k].logprobs[t]) < 1e-4);
      }
    }
  }
  // A resume that does not fit the request is refused by field.
  GenerationRequest bad = reqs[0];
  bad.resume.resize(1);
  CHECK(second.Submit(bad).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Generator rejects bad requests by field") {
  auto m = MakeModel(Tiny());
  Generator gen(m, {.max_batch = 4});
  SamplingOptions s;
  CHECK(std::string(gen.Submit(Req({}, s)).message()).find("prompt") != std::string::npos);
  CHECK(std::string(gen.Submit(Req({50}, s)).message()).find("prompt[0]") != std::string::npos);
  s.n = 5;
  CHECK(std::string(gen.Submit(Req({1}, s)).message()).find("sampling.n") != std::string::npos);
  s = SamplingOptions();
  s.temperature = 0;
  CHECK(std::string(gen.Submit(Req({1}, s)).message()).find("temperature") != std::string::npos);
  s = SamplingOptions();
  s.top_p = 1.5f;
  CHECK(std::string(gen.Submit(Req({1}, s)).message()).find("top_p") != std::string::npos);
  CHECK(gen.Idle());
}

}  // namespace
}  // namespace rlmesh::actor

namespace rlmesh::actor {
namespace {

TEST_CASE("bf16 model generates and scores without fp32 copies") {
  auto m = MakeModel(Tiny("qwen2"));
  m->to(torch::kBFloat16);
  SamplingOptions s;
  s.max_new_tokens = 6;
  s.n = 2;
  s.seed = 9;
  Generator gen(m);
  auto res = gen.Generate({Req({1, 2, 3, 4}, s)});
  REQUIRE(res.ok());
  for (const auto& c : (*res)[0].samples) {
    REQUIRE(c.tokens.size() == 6);
    for (float lp : c.logprobs) {
      CHECK(std::isfinite(lp));
      CHECK(lp <= 0.0f);
    }
    // Behaviour log-probs agree with the learner's recomputation to bf16
    // precision.
    std::vector<int64_t> seq = {1, 2, 3, 4};
    seq.insert(seq.end(), c.tokens.begin(), c.tokens.end());
    const int64_t T = static_cast<int64_t>(seq.size());
    auto ids = torch::tensor(seq).unsqueeze(0);
    auto targets = torch::full({1, T}, -1, torch::kLong);
    for (int64_t t = 3; t < T - 1; ++t) targets[0][t] = seq[t + 1];
    torch::NoGradGuard g;
    auto lp = TokenLogProbs(m, ids, Positions(1, T), targets, 4);
    REQUIRE(lp.ok());
    CHECK(lp->logprobs.scalar_type() == torch::kFloat32);
    for (size_t t = 0; t < c.tokens.size(); ++t) {
      CHECK(std::abs(lp->logprobs[0][3 + t].item<float>() - c.logprobs[t]) < 0.1);
    }
  }
}

}  // namespace
}  // namespace rlmesh::actor
