// ZeRO-3 must reproduce one process: Gloo groups on threads over a
// HashStore, each rank a FullyShardedModel holding 1/dp of every unit and
// training on its own rows (an uneven split), three AdamW steps with
// clipping active against the whole model on the whole batch; gradient
// norms and gathered weights must agree within 1e-5 (fp32), also with
// tensor parallelism inside each replica (ZeRO-3 over the tp ranks'
// slices). Checkpoints gathered at one layout resume at another.
#include "learner/fully_sharded.h"

#include <torch/torch.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "dist/gloo.h"
#include "dist/store.h"
#include "learner/testing/model_parallel_testing.h"

namespace rlmesh::learner {
namespace {

using namespace model_parallel_testing;  // NOLINT: the shared fixture

FullyShardedOptions Options(bool prefetch, c10::intrusive_ptr<c10d::Backend> tp_group = {}) {
  FullyShardedOptions o;
  o.tensor_parallel = tp_group;
  o.prefetch = prefetch;
  o.logprob_chunk = 4;
  o.optimizer = Optimizer();
  return o;
}

// The moments as one tensor per shard (FullyShardedModel::Shards order).
std::vector<at::Tensor> PerShard(const at::Tensor& flat, const std::vector<at::Tensor>& shards) {
  return UnflattenLike(flat, shards);
}

// One rank: `steps` steps from `start`, then the gathered checkpoint.
absl::StatusOr<Run> TrainRank(const actor::ModelConfig& c, const Checkpoint& start, const Batch& rows,
                              c10::intrusive_ptr<c10d::Backend> group, c10::intrusive_ptr<c10d::Backend> tp_group,
                              int steps, bool prefetch) {
  auto model = FullyShardedModel::Create(c, group, Options(prefetch, tp_group));
  if (!model.ok()) return model.status();
  FullyShardedModel& m = **model;
  absl::Status s = m.LoadFromFull(start.weights);
  if (!s.ok()) return s;
  if (start.steps > 0) {
    auto avg = m.SliceOf(start.exp_avg);
    auto sq = m.SliceOf(start.exp_avg_sq);
    if (!avg.ok()) return avg.status();
    if (!sq.ok()) return sq.status();
    s = m.LoadOptimizerState(FlattenAll(*avg), FlattenAll(*sq), start.steps);
    if (!s.ok()) return s;
  }
  Run r;
  for (int step = 0; step < steps; ++step) {
    m.ZeroGrad(Weight(rows));
    auto out = m.TokenLogProbs(rows.ids, rows.pos, rows.targets, 0.9, rows.mask);
    if (!out.ok()) return out.status();
    at::Tensor loss = Loss(*out, rows.targets);
    loss.backward();
    auto stats = m.Step(kLr);
    if (!stats.ok()) return stats.status();
    r.losses.push_back(loss.item<double>());
    r.norms.push_back(stats->grad_norm);
  }
  auto full = m.GatherFull();
  if (!full.ok()) return full.status();
  r.weights = *full;
  auto avg = m.GatherFullOf(PerShard(m.exp_avg(), m.Shards()));
  auto sq = m.GatherFullOf(PerShard(m.exp_avg_sq(), m.Shards()));
  if (!avg.ok()) return avg.status();
  if (!sq.ok()) return sq.status();
  r.checkpoint = {*full, *avg, *sq, m.steps()};
  return r;
}

// dp x tp ranks on threads (TrainOnLayout): at dp = 2 replica 0 trains one
// row and replica 1 two.
std::vector<Run> TrainLayout(const actor::ModelConfig& c, const Checkpoint& start, const Batch& batch, int dp,
                             int tp, int steps = kSteps, bool prefetch = true) {
  return TrainOnLayout(batch, dp, tp, [&](const Batch& rows, auto tp_group, auto dp_group) {
    return TrainRank(c, start, rows, dp_group, tp_group, steps, prefetch);
  });
}

void CheckEqualsReference(const std::string& arch, int dp, bool prefetch = true, int tp = 1) {
  CAPTURE(arch, dp, prefetch, tp);
  const actor::ModelConfig c = SmallConfig(arch);
  const Named init = InitialWeights(c);
  const Batch batch = MakeBatch();
  const Run ref = Reference(c, init, batch);
  // Not vacuous: clipping acted and the weights moved.
  REQUIRE(ref.norms[0] > Optimizer().grad_clip);
  REQUIRE(MaxAbsDiff(ref.weights, init) > 1e-3);
  for (const Run& r : TrainLayout(c, Checkpoint{init}, batch, dp, tp, kSteps, prefetch)) {
    for (int step = 0; step < kSteps; ++step) {
      CAPTURE(step);
      CHECK(r.norms[step] == Approx(ref.norms[step]).epsilon(1e-5));
      if (dp == 1) CHECK(std::abs(r.losses[step] - ref.losses[step]) < 1e-5);
    }
    CHECK(MaxAbsDiff(r.weights, ref.weights) < 1e-5);
  }
}

TEST_CASE("ZeRO-3 on one rank equals one process: llama, qwen2 (q/k/v bias), qwen3 (tied embeddings)") {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) CheckEqualsReference(arch, 1);
}

TEST_CASE("dp=2 x ZeRO-3 equals one process on the whole batch (rows split 1 / 2)") {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) CheckEqualsReference(arch, 2);
}

TEST_CASE("dp=2 x ZeRO-3 without prefetch takes the same steps") { CheckEqualsReference("qwen3", 2, false); }

TEST_CASE("tp=2 x ZeRO-3 equals one process: llama, qwen2 (q/k/v bias), qwen3 (QK-norm, tied embeddings)") {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) CheckEqualsReference(arch, 1, true, 2);
}

TEST_CASE("dp=2 x tp=2 x ZeRO-3 equals one process (rows split 1 / 2, each replica's tp ranks the same rows)") {
  for (const char* arch : {"llama", "qwen3"}) CheckEqualsReference(arch, 2, true, 2);
  CheckEqualsReference("qwen2", 2, false, 2);
}

TEST_CASE("a ZeRO-3 checkpoint gathered at one layout resumes at another (dp, and dp x tp)") {
  const actor::ModelConfig c = SmallConfig("qwen3");
  const Batch batch = MakeBatch();
  const Checkpoint init{InitialWeights(c)};
  const Run straight = TrainLayout(c, init, batch, 1, 1, 5)[0];
  REQUIRE(straight.checkpoint.steps == 5);
  // (dp, tp) of the first three steps, then of the last two.
  using Layout = std::pair<int, int>;
  for (auto [first, second] : {std::pair<Layout, Layout>{{2, 1}, {1, 1}}, std::pair<Layout, Layout>{{1, 1}, {2, 1}},
                               std::pair<Layout, Layout>{{2, 2}, {1, 1}}, std::pair<Layout, Layout>{{1, 1}, {2, 2}},
                               std::pair<Layout, Layout>{{1, 2}, {2, 1}}}) {
    CAPTURE(first.first, first.second, second.first, second.second);
    const Run a = TrainLayout(c, init, batch, first.first, first.second, 3)[0];
    REQUIRE(a.checkpoint.steps == 3);
    REQUIRE(a.checkpoint.exp_avg_sq.size() == init.weights.size());
    CHECK(a.checkpoint.exp_avg_sq[0].second.abs().sum().item<double>() > 0);
    for (const Run& b : TrainLayout(c, a.checkpoint, batch, second.first, second.second, 2)) {
      CHECK(b.checkpoint.steps == 5);
      CHECK(b.norms[1] == Approx(straight.norms[4]).epsilon(1e-5));
      CHECK(MaxAbsDiff(b.weights, straight.weights) < 1e-5);
      CHECK(MaxAbsDiff(b.checkpoint.exp_avg, straight.checkpoint.exp_avg) < 1e-6);
    }
    // Without the moments the run is measurably different: they matter.
    const Run fresh = TrainLayout(c, Checkpoint{a.checkpoint.weights}, batch, second.first, second.second, 2)[0];
    CHECK(MaxAbsDiff(fresh.weights, straight.weights) > 1e-4);
  }
}

TEST_CASE("each rank holds 1/dp of the parameters, and the module none between units") {
  const actor::ModelConfig c = SmallConfig("llama");
  OnRanks(2, [&](int, c10::intrusive_ptr<c10d::Backend> g) -> absl::Status {
    auto m = FullyShardedModel::Create(c, g, Options(true));
    if (!m.ok()) return m.status();
    int64_t whole = 0;
    for (auto& [name, t] : InitialWeights(c)) whole += t.numel();
    if ((*m)->full_numel() != whole) return absl::InternalError("full_numel is not the model's size");
    // Units are padded to a multiple of 2: at most one element each.
    const int64_t units = c.num_layers + 2;
    if ((*m)->shard_numel() * 2 < whole || (*m)->shard_numel() * 2 > whole + units) {
      return absl::InternalError(absl::StrCat("shard_numel ", (*m)->shard_numel(), " is not half of ", whole));
    }
    for (size_t u = 0; u < (*m)->num_units(); ++u) {
      for (const at::Tensor& p : (*m)->UnitParams(u)) {
        if (p.numel() != 0) return absl::InternalError("a module parameter holds data between units");
      }
    }
    return absl::OkStatus();
  });
}

TEST_CASE("VisitFull: the whole weights one unit at a time; a failed visit still makes every gather") {
  const actor::ModelConfig c = SmallConfig("qwen3");
  const Named initial = InitialWeights(c);
  OnRanks(2, [&](int d, c10::intrusive_ptr<c10d::Backend> g) -> absl::Status {
    auto m = FullyShardedModel::Create(c, g, Options(true));
    if (!m.ok()) return m.status();
    absl::Status s = (*m)->LoadFromFull(initial);
    if (!s.ok()) return s;
    // Every parameter once, in GatherFull's order, equal to the loaded
    // weights (the views are compared during the call, as they must be).
    auto gathered = (*m)->GatherFull();
    if (!gathered.ok()) return gathered.status();
    size_t i = 0;
    s = (*m)->VisitFull([&](const std::string& name, const at::Tensor& full) -> absl::Status {
      if (i >= gathered->size() || (*gathered)[i].first != name) {
        return absl::InternalError(absl::StrCat("visit ", i, " is ", name));
      }
      if (!torch::equal(full, (*gathered)[i].second)) return absl::InternalError(name + " differs");
      ++i;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    if (i != initial.size()) return absl::InternalError(absl::StrCat(i, " visits for ", initial.size()));
    for (const auto& [name, t] : *gathered) {
      bool found = false;
      for (const auto& [n, w] : initial) found = found || (n == name && torch::equal(w, t));
      if (!found) return absl::InternalError(name + " is not the loaded weight");
    }
    // Rank 1's visitor fails at its first parameter: it returns that
    // error, and both ranks finish (a rank that stopped gathering would
    // leave the other waiting in the next unit's all-gather).
    int calls = 0;
    s = (*m)->VisitFull([&](const std::string& name, const at::Tensor&) -> absl::Status {
      ++calls;
      return d == 1 ? absl::DataLossError("refused " + name) : absl::OkStatus();
    });
    if (d == 0 && !s.ok()) return s;
    if (d == 1 && (s.code() != absl::StatusCode::kDataLoss || calls != 1)) {
      return absl::InternalError(absl::StrCat("rank 1: ", s.ToString(), " after ", calls, " calls"));
    }
    // The group still works: the two ranks are in step.
    return (*m)->GatherFull().status();
  });
}

// A reward model's layout: the head unit gives values, the lm_head is
// sharded but frozen. The optimizer's weight decay would move an lm_head it
// stepped.
TEST_CASE("a value-head model at dp=2: values and steps equal one process's, the lm_head stays frozen") {
  actor::ModelConfig c = SmallConfig("llama");
  c.value_head = true;
  const Named init = InitialWeights(c);
  const Batch batch = MakeBatch();
  at::Tensor first_values;
  const Named ref = ValueReference(c, init, batch, &first_values);
  REQUIRE(MaxAbsDiff(ref, init) > 1e-3);
  at::Tensor lm_head;
  for (const auto& [name, t] : init) {
    if (name == "lm_head.weight") lm_head = t;
  }
  int64_t whole = 0;
  for (const auto& [name, t] : init) whole += t.numel();
  OnRanks(2, [&](int rank, c10::intrusive_ptr<c10d::Backend> group) -> absl::Status {
    auto m = FullyShardedModel::Create(c, group, Options(true));
    if (!m.ok()) return m.status();
    FullyShardedModel& f = **m;
    if (f.full_numel() != whole - lm_head.numel()) return absl::InternalError("full_numel counts the lm_head");
    absl::Status s = f.LoadFromFull(init);
    if (!s.ok()) return s;
    const Batch rows = rank == 0 ? Rows(batch, 0, 1) : Rows(batch, 1, 2);
    for (int step = 0; step < kSteps; ++step) {
      f.ZeroGrad(Weight(rows));
      auto v = f.Values(rows.ids, rows.pos, rows.mask);
      if (!v.ok()) return v.status();
      if (step == 0) {
        const double d = (*v - first_values.narrow(0, rank == 0 ? 0 : 1, rows.ids.size(0))).abs().max().item<double>();
        if (d > 1e-5) return absl::InternalError(absl::StrCat("values ", d, " off one process's"));
      }
      ValueLoss(*v, rows.targets).backward();
      auto stats = f.Step(kLr);
      if (!stats.ok()) return stats.status();
    }
    auto lp = f.TokenLogProbs(rows.ids, rows.pos, rows.targets);
    if (lp.status().code() != absl::StatusCode::kFailedPrecondition) {
      return absl::InternalError(absl::StrCat("log-probs of a frozen lm_head: ", lp.status().ToString()));
    }
    auto full = f.GatherFull();
    if (!full.ok()) return full.status();
    const double d = MaxAbsDiffOrMinusOne(*full, ref);
    if (d < 0 || d > 1e-5) return absl::InternalError(absl::StrCat("weights ", d, " off one process's"));
    for (const auto& [name, t] : *full) {
      if (name == "lm_head.weight" && !t.equal(lm_head)) return absl::InternalError("the lm_head moved");
    }
    return absl::OkStatus();
  });
}

TEST_CASE("LoadMomentsFrom reads only this rank's share and equals LoadMoments; refused over TP slices") {
  const actor::ModelConfig c = SmallConfig("qwen3");
  OnRanks(2, [&](int, c10::intrusive_ptr<c10d::Backend> g) -> absl::Status {
    auto a = FullyShardedModel::Create(c, g, Options(true));
    auto b = FullyShardedModel::Create(c, g, Options(true));
    if (!a.ok() || !b.ok()) return absl::InternalError("create");
    at::manual_seed(5);  // the same whole moments on both ranks
    const at::Tensor m = at::randn({(*a)->full_numel()}), v = at::rand({(*a)->full_numel()});
    absl::Status s = (*a)->LoadMoments(m, v, 4);
    if (!s.ok()) return s;
    int64_t read = 0;
    s = (*b)->LoadMomentsFrom(
        [&](int k, int64_t begin, int64_t count) -> absl::StatusOr<at::Tensor> {
          read += count;
          return (k == 0 ? m : v).narrow(0, begin, count).clone();
        },
        4);
    if (!s.ok()) return s;
    if (!torch::equal((*a)->exp_avg(), (*b)->exp_avg()) || !torch::equal((*a)->exp_avg_sq(), (*b)->exp_avg_sq()) ||
        (*b)->steps() != 4) {
      return absl::InternalError("LoadMomentsFrom differs from LoadMoments");
    }
    // Both moments, about half of each: never the whole.
    if (read > (*a)->full_numel() + 2 * static_cast<int64_t>((*a)->num_units())) {
      return absl::InternalError(absl::StrCat(read, " elements read of 2 x ", (*a)->full_numel()));
    }
    // The same group as tensor-parallel: the slices are not ranges.
    auto tp = FullyShardedModel::Create(c, nullptr, Options(true, g));
    if (!tp.ok()) return tp.status();
    s = (*tp)->LoadMomentsFrom([](int, int64_t, int64_t) { return at::zeros({0}); }, 1);
    if (s.code() != absl::StatusCode::kFailedPrecondition) return absl::InternalError("TP: " + s.ToString());
    return absl::OkStatus();
  });
}

TEST_CASE("models and options ZeRO-3 cannot take are refused by name") {
  actor::ModelConfig moe = SmallConfig("llama");
  moe.arch = "qwen3_moe";
  moe.num_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 16;
  auto refused = FullyShardedModel::Create(moe, nullptr);
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(std::string(refused.status().message()).find("model.arch qwen3_moe") != std::string::npos);
  FullyShardedOptions zero1 = Options(true);
  zero1.optimizer.zero1 = true;
  auto no_zero1 = FullyShardedModel::Create(SmallConfig("llama"), nullptr, zero1);
  REQUIRE(!no_zero1.ok());
  CHECK(std::string(no_zero1.status().message()).find("zero1") != std::string::npos);
  auto m = FullyShardedModel::Create(SmallConfig("llama"), nullptr);
  REQUIRE(m.ok());
  Named partial = InitialWeights(SmallConfig("llama"));
  partial.pop_back();
  absl::Status missing = (*m)->LoadFromFull(partial);
  CHECK(missing.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(missing.message()).find("missing") != std::string::npos);
}

}  // namespace
}  // namespace rlmesh::learner
