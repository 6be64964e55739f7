// The tensor-parallel library against the whole model: Gloo groups on
// threads over a HashStore, each rank a TensorParallelModel; tp = 2 greedy
// generation and one rank's log-probs equal the whole model's, the layouts
// it cannot take and bad weights are refused by name, and weight pieces cut
// from any layout join into any other's slices. Training under tensor
// parallelism (with the learner's optimizer) is
// learner/tensor_parallel_training_test.cc.
#include "parallel/tensor_parallel.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "dist/gloo.h"
#include "parallel/testing/model_testing.h"

namespace rlmesh::parallel {
namespace {

using namespace model_testing;  // NOLINT: the shared fixture

// Greedy decoding of two right-padded prompts (lengths 5 and 3) for 6
// tokens through the given prefill / decode / next-token functions: the
// tokens [2, 6] and their log-probs.
struct Greedy {
  at::Tensor tokens, logprobs;
};

template <typename PrefillFn, typename DecodeFn, typename NextFn>
Greedy GreedyDecode(PrefillFn prefill, DecodeFn decode, NextFn next) {
  at::Tensor prompts = at::tensor({7, 3, 9, 30, 2, 41, 5, 17, 0, 0}, at::kLong).view({2, 5});
  at::Tensor lens = at::tensor({5, 3}, at::kLong);
  actor::KvCache cache;
  at::Tensor h = prefill(prompts, lens, 16, &cache);
  std::vector<at::Tensor> tokens, logprobs;
  for (int t = 0; t < 6; ++t) {
    auto [id, lp] = next(h);
    tokens.push_back(id);
    logprobs.push_back(lp);
    if (t == 5) break;
    h = decode(id, lens, lens.max().item<int64_t>(), &cache);
    lens = lens + 1;
  }
  return {at::stack(tokens, 1), at::stack(logprobs, 1)};
}

TEST_CASE("tp=2 generation (KV cache, greedy over the vocabulary-parallel head) equals the whole model's") {
  for (const char* arch : {"llama", "qwen3"}) {
    CAPTURE(arch);
    const actor::ModelConfig c = SmallConfig(arch);
    const Named init = InitialWeights(c);
    actor::Transformer full(c);
    {
      torch::NoGradGuard no_grad;
      std::map<std::string, at::Tensor> src(init.begin(), init.end());
      for (auto& [name, p] : full->NamedParameters()) p.copy_(src.at(name));
    }
    torch::NoGradGuard no_grad;
    const Greedy ref = GreedyDecode(
        [&](auto&&... a) { return full->Prefill(a...); }, [&](auto&&... a) { return full->DecodeStep(a...); },
        [&](const at::Tensor& h) {
          auto logp = at::log_softmax(full->Logits(h).to(at::kFloat), -1);
          auto id = logp.argmax(-1);
          return std::pair<at::Tensor, at::Tensor>{id, logp.gather(-1, id.unsqueeze(-1)).squeeze(-1)};
        });
    // Not vacuous: the continuation is not one repeated token.
    REQUIRE(std::get<0>(at::_unique(ref.tokens)).numel() > 1);
    auto store = c10::make_intrusive<c10d::HashStore>();
    std::vector<std::future<absl::StatusOr<Greedy>>> ranks;
    std::vector<c10::intrusive_ptr<c10d::Backend>> groups(2);
    for (int rank = 0; rank < 2; ++rank) {
      ranks.push_back(std::async(std::launch::async, [&, rank]() -> absl::StatusOr<Greedy> {
        auto g = dist::CreateGlooGroup(store, rank, 2);
        if (!g.ok()) return g.status();
        groups[rank] = *g;
        auto m = TensorParallelModel::Create(c, *g);
        if (!m.ok()) return m.status();
        absl::Status s = (*m)->LoadFromFull(init);
        if (!s.ok()) return s;
        torch::NoGradGuard no_grad;
        auto* tp = m->get();
        return GreedyDecode([&](auto&&... a) { return tp->Prefill(a...); },
                            [&](auto&&... a) { return tp->DecodeStep(a...); },
                            [&](const at::Tensor& h) { return tp->GreedyNext(h); });
      }));
    }
    for (auto& f : ranks) {
      REQUIRE(f.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
      auto got = f.get();
      INFO(got.status().ToString());
      REQUIRE(got.ok());
      CHECK(at::equal(got->tokens, ref.tokens));
      CHECK((got->logprobs - ref.logprobs).abs().max().item<double>() < 1e-5);
    }
  }
}

TEST_CASE("one rank: the log-probs and entropies are the whole model's") {
  const actor::ModelConfig c = SmallConfig("llama");
  const Named init = InitialWeights(c);
  const Batch b = MakeBatch();
  actor::Transformer full(c);
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> src(init.begin(), init.end());
    for (auto& [name, p] : full->NamedParameters()) p.copy_(src.at(name));
  }
  auto ref = actor::TokenLogProbs(full, b.ids, b.pos, b.targets, 7, 1.3, b.mask);
  REQUIRE(ref.ok());
  auto m = TensorParallelModel::Create(c, nullptr);
  REQUIRE(m.ok());
  REQUIRE((*m)->LoadFromFull(init).ok());
  auto out = (*m)->TokenLogProbs(b.ids, b.pos, b.targets, 1.3, b.mask);
  REQUIRE(out.ok());
  CHECK((out->logprobs - ref->logprobs).abs().max().item<double>() < 1e-5);
  CHECK((out->entropy - ref->entropy).abs().max().item<double>() < 1e-5);
  CHECK(out->logprobs.abs().sum().item<double>() > 1.0);
  // The gather of one rank is the model itself, bit for bit.
  auto gathered = (*m)->GatherFull();
  REQUIRE(gathered.ok());
  CHECK(MaxAbsDiff(*gathered, init) == 0.0);
}

TEST_CASE("layouts the model cannot take are refused by name") {
  actor::ModelConfig c = SmallConfig("llama");
  CHECK(ValidateTensorParallel(c, 2).ok());
  CHECK(ValidateTensorParallel(c, 4).code() == absl::StatusCode::kUnimplemented);  // 2 KV heads
  CHECK(absl::StrContains(ValidateTensorParallel(c, 4).message(), "num_kv_heads"));
  c.num_kv_heads = 4;
  c.vocab_size = 50;
  CHECK(absl::StrContains(ValidateTensorParallel(c, 4).message(), "vocab_size (50)"));
  c.vocab_size = 48;
  c.intermediate_size = 66;
  CHECK(absl::StrContains(ValidateTensorParallel(c, 4).message(), "intermediate_size (66)"));
  c = SmallConfig("llama");
  c.num_kv_heads = 4;
  CHECK(absl::StrContains(ValidateTensorParallel(c, 3).message(), "num_heads (4) is not divisible by tp (3)"));
  c = SmallConfig("llama");
  c.arch = "qwen3_moe";
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  CHECK(ValidateTensorParallel(c, 2).code() == absl::StatusCode::kUnimplemented);
  c = SmallConfig("llama");
  c.qkv_bias = true;
  CHECK(absl::StrContains(ValidateTensorParallel(c, 2).message(), "o_proj bias"));
  CHECK(ValidateTensorParallel(SmallConfig("llama"), 0).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("LoadFromFull names a missing or misshapen parameter") {
  const actor::ModelConfig c = SmallConfig("llama");
  auto m = TensorParallelModel::Create(c, nullptr);
  REQUIRE(m.ok());
  Named init = InitialWeights(c);
  Named missing(init.begin() + 1, init.end());
  CHECK(absl::StrContains((*m)->LoadFromFull(missing).message(), init[0].first + ": missing"));
  init[1].second = at::zeros({3, 3});
  CHECK(absl::StrContains((*m)->LoadFromFull(init).message(), init[1].first + ": expected shape"));
}

// Slice `rank` of `size` of a whole parameter, written out here from the
// Megatron layout (not through the library).
at::Tensor ExpectedSlice(const std::string& name, const at::Tensor& whole, int rank, int size) {
  int dim = -1;
  for (const char* col : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head"}) {
    if (absl::StrContains(name, col)) dim = 0;
  }
  for (const char* row : {"o_proj", "down_proj"}) {
    if (absl::StrContains(name, row)) dim = 1;
  }
  if (dim < 0) return whole;
  const int64_t n = whole.size(dim) / size;
  return whole.narrow(dim, rank * n, n);
}

TEST_CASE("weight pieces: cut from any learner layout, joined into any rollout layout, give its slices") {
  actor::ModelConfig c = SmallConfig("qwen2");
  c.num_kv_heads = 4;
  REQUIRE(ValidateTensorParallel(c, 4).ok());
  const Named whole = InitialWeights(c);
  for (int learner_tp : {1, 2, 4}) {
    for (int rollout_tp : {1, 2, 4}) {
      const int pieces = std::max(learner_tp, rollout_tp);
      INFO("learner tp " << learner_tp << ", rollout tp " << rollout_tp);
      // Piece c comes from the learner rank whose slice holds it.
      std::vector<Named> piece(pieces);
      for (int t = 0; t < learner_tp; ++t) {
        for (int p = t * pieces / learner_tp; p < (t + 1) * pieces / learner_tp; ++p) {
          for (const auto& [name, w] : whole) {
            auto cut = TensorParallelPiece(name, ExpectedSlice(name, w, t, learner_tp), t, learner_tp, p, pieces);
            REQUIRE(cut.ok());
            piece[p].emplace_back(name, *cut);
          }
        }
      }
      for (int r = 0; r < rollout_tp; ++r) {
        for (size_t i = 0; i < whole.size(); ++i) {
          const std::string& name = whole[i].first;
          std::vector<at::Tensor> parts;
          for (int p = r * pieces / rollout_tp; p < (r + 1) * pieces / rollout_tp; ++p) parts.push_back(piece[p][i].second);
          INFO(name << " rank " << r);
          CHECK(torch::equal(JoinTensorParallelPieces(name, parts), ExpectedSlice(name, whole[i].second, r, rollout_tp)));
        }
      }
    }
  }
  // A one-rank model takes its slices (the whole) as LoadFromFull does.
  auto m = TensorParallelModel::Create(c, nullptr);
  REQUIRE(m.ok());
  REQUIRE((*m)->LoadSlices(whole).ok());
  const Named loaded = (*m)->NamedParameters();
  REQUIRE(loaded.size() == whole.size());
  for (size_t i = 0; i < whole.size(); ++i) CHECK(torch::equal(loaded[i].second, whole[i].second));

  // Refused by name: pieces that do not fit the slices, a piece outside the
  // slice, a dimension the pieces do not divide; LoadSlices' missing,
  // misshapen, unknown and repeated parameters.
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  at::Tensor qw;
  for (const auto& [name, w] : whole) {
    if (name == q) qw = w;
  }
  REQUIRE(qw.defined());
  CHECK(absl::StrContains(TensorParallelPiece(q, qw, 0, 2, 0, 3).status().message(), "not a multiple"));
  CHECK(absl::StrContains(TensorParallelPiece(q, qw, 0, 2, 2, 4).status().message(), "not inside slice 0"));
  CHECK(absl::StrContains(TensorParallelPiece(q, qw, 0, 1, 0, 5).status().message(), q));
  Named missing(whole.begin() + 1, whole.end());
  CHECK(absl::StrContains((*m)->LoadSlices(missing).message(), whole[0].first + ": missing"));
  Named misshapen = whole;
  misshapen[1].second = at::zeros({3, 3});
  CHECK(absl::StrContains((*m)->LoadSlices(misshapen).message(), whole[1].first + ": expected the slice shape"));
  Named unknown = whole;
  unknown.emplace_back("extra.weight", at::zeros({2}));
  CHECK(absl::StrContains((*m)->LoadSlices(unknown).message(), "extra.weight: not in the model"));
  Named twice = whole;
  twice.push_back(whole[0]);
  CHECK(absl::StrContains((*m)->LoadSlices(twice).message(), "given twice"));
  // Nothing was copied by the refused calls.
  for (size_t i = 0; i < whole.size(); ++i) CHECK(torch::equal((*m)->NamedParameters()[i].second, whole[i].second));
}

TEST_CASE("split dimensions follow Megatron's column / row / vocabulary layout") {
  CHECK(TensorParallelSplitDim("model.layers.0.self_attn.q_proj.weight") == 0);
  CHECK(TensorParallelSplitDim("model.layers.0.self_attn.v_proj.bias") == 0);
  CHECK(TensorParallelSplitDim("model.layers.3.mlp.up_proj.weight") == 0);
  CHECK(TensorParallelSplitDim("model.embed_tokens.weight") == 0);
  CHECK(TensorParallelSplitDim("lm_head.weight") == 0);
  CHECK(TensorParallelSplitDim("model.layers.0.self_attn.o_proj.weight") == 1);
  CHECK(TensorParallelSplitDim("model.layers.1.mlp.down_proj.weight") == 1);
  CHECK(TensorParallelSplitDim("model.layers.0.input_layernorm.weight") == -1);
  CHECK(TensorParallelSplitDim("model.layers.0.self_attn.q_norm.weight") == -1);
  CHECK(TensorParallelSplitDim("model.norm.weight") == -1);
}

}  // namespace
}  // namespace rlmesh::parallel
