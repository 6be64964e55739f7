// Tensor parallelism must train as one process: Gloo groups on threads over
// a HashStore, each rank a parallel::TensorParallelModel under the learner's
// DataParallel optimizer, trained three AdamW steps (gradient clipping
// active) on the same batch as the whole model; the losses, gradient norms
// and gathered weights must agree within 1e-5 (fp32), for tp = 2 with and
// without sequence parallelism, and tp = 2 x dp = 2 (plain and ZeRO-1). A
// value-head model trains the same way, and a checkpoint gathered under one
// layout resumes under another.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "learner/data_parallel.h"
#include "learner/testing/model_parallel_testing.h"
#include "parallel/tensor_parallel.h"

namespace rlmesh::learner {
namespace {

using namespace model_parallel_testing;  // NOLINT: the shared fixture
using parallel::TensorParallelModel;
using parallel::TensorParallelOptions;

// Trains `steps` steps from `start` (weights; moments and step count when
// start.steps > 0) and returns the run with its checkpoint gathered.
absl::StatusOr<Run> TrainRank(const actor::ModelConfig& c, const Checkpoint& start, const Batch& batch,
                              c10::intrusive_ptr<c10d::Backend> tp_group,
                              c10::intrusive_ptr<c10d::Backend> dp_group, bool sequence_parallel, int steps,
                              bool zero1) {
  TensorParallelOptions tpo;
  tpo.sequence_parallel = sequence_parallel;
  auto model = TensorParallelModel::Create(c, tp_group, tpo);
  if (!model.ok()) return model.status();
  absl::Status s = (*model)->LoadFromFull(start.weights);
  if (!s.ok()) return s;
  DataParallelOptions o = Optimizer();
  o.zero1 = zero1;
  o.norm_groups = {tp_group};
  o.norm_weights = (*model)->NormWeights();
  auto dp = DataParallel::Create(dp_group, (*model)->TrainedParameters(), o);
  if (!dp.ok()) return dp.status();
  if (start.steps > 0) {
    auto m = (*model)->SliceOf(start.exp_avg);
    auto v = (*model)->SliceOf(start.exp_avg_sq);
    if (!m.ok()) return m.status();
    if (!v.ok()) return v.status();
    s = (*dp)->LoadOptimizerState(FlattenAll(*m), FlattenAll(*v), start.steps);
    if (!s.ok()) return s;
  }
  Run r;
  for (int step = 0; step < steps; ++step) {
    (*dp)->ZeroGrad();
    auto out = (*model)->TokenLogProbs(batch.ids, batch.pos, batch.targets, 0.9, batch.mask);
    if (!out.ok()) return out.status();
    at::Tensor loss = Loss(*out, batch.targets);
    loss.backward();
    auto stats = (*dp)->Step(Weight(batch), kLr);
    if (!stats.ok()) return stats.status();
    r.losses.push_back(loss.item<double>());
    r.norms.push_back(stats->grad_norm);
  }
  auto full = (*model)->GatherFull();
  if (!full.ok()) return full.status();
  r.weights = *full;
  r.checkpoint = {*full, {}, {}, (*dp)->steps()};
  // The moments as a checkpoint holds them; ZeRO-1 keeps only a flat shard
  // of them per rank (not gathered here).
  if (zero1) return r;
  const std::vector<at::Tensor> params = (*model)->TrainedParameters();
  auto m = (*model)->GatherFullOf(UnflattenLike((*dp)->exp_avg(), params));
  auto v = (*model)->GatherFullOf(UnflattenLike((*dp)->exp_avg_sq(), params));
  if (!m.ok()) return m.status();
  if (!v.ok()) return v.status();
  r.checkpoint.exp_avg = *m;
  r.checkpoint.exp_avg_sq = *v;
  return r;
}

// tp x dp ranks on threads (TrainOnLayout); the dp replicas split the
// batch's rows.
std::vector<Run> TrainLayout(const actor::ModelConfig& c, const Checkpoint& start, const Batch& batch, int tp,
                             int dp, bool sequence_parallel, int steps = kSteps, bool zero1 = false) {
  return TrainOnLayout(batch, dp, tp, [&](const Batch& rows, auto tp_group, auto dp_group) {
    return TrainRank(c, start, rows, tp_group, dp_group, sequence_parallel, steps, zero1);
  });
}

void CheckEqualsReference(const std::string& arch, int tp, int dp, bool sequence_parallel, bool zero1 = false) {
  CAPTURE(arch, tp, dp, sequence_parallel, zero1);
  const actor::ModelConfig c = SmallConfig(arch);
  const Named init = InitialWeights(c);
  const Batch batch = MakeBatch();
  const Run ref = Reference(c, init, batch);
  // Not vacuous: clipping acted and the weights moved.
  REQUIRE(ref.norms[0] > Optimizer().grad_clip);
  REQUIRE(MaxAbsDiff(ref.weights, init) > 1e-3);
  for (const Run& r : TrainLayout(c, Checkpoint{init}, batch, tp, dp, sequence_parallel, kSteps, zero1)) {
    for (int step = 0; step < kSteps; ++step) {
      CAPTURE(step);
      CHECK(r.norms[step] == Approx(ref.norms[step]).epsilon(1e-5));
      // A dp replica's loss is over its own rows; compare where it is the
      // whole batch's.
      if (dp == 1) CHECK(std::abs(r.losses[step] - ref.losses[step]) < 1e-5);
    }
    CHECK(MaxAbsDiff(r.weights, ref.weights) < 1e-5);
  }
}

TEST_CASE("tp=2 equals one process: llama, qwen2 (q/k/v bias), qwen3 (QK-norm, tied embeddings)") {
  for (const char* arch : {"llama", "qwen2", "qwen3"}) CheckEqualsReference(arch, 2, 1, false);
}

TEST_CASE("tp=2 with sequence parallelism equals one process (21 rows: padded to 22)") {
  for (const char* arch : {"llama", "qwen3"}) CheckEqualsReference(arch, 2, 1, true);
}

TEST_CASE("tp=2 x dp=2 equals one process, plain DP and ZeRO-1") {
  CheckEqualsReference("qwen3", 2, 2, false);
  CheckEqualsReference("qwen3", 2, 2, false, /*zero1=*/true);
}

// A reward model's layout: a replicated value head on the replicated (or,
// with sequence parallelism, row-split) final hidden states; the lm_head out
// of the optimizer, whose weight decay would move it.
TEST_CASE("a value-head model at tp=2, with and without sequence parallelism: values and steps equal one "
          "process's, the lm_head stays frozen") {
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
  const bool sp = GENERATE(false, true);
  CAPTURE(sp);
  OnRanks(2, [&](int, c10::intrusive_ptr<c10d::Backend> group) -> absl::Status {
    TensorParallelOptions tpo;
    tpo.sequence_parallel = sp;
    auto model = TensorParallelModel::Create(c, group, tpo);
    if (!model.ok()) return model.status();
    TensorParallelModel& m = **model;
    absl::Status s = m.LoadFromFull(init);
    if (!s.ok()) return s;
    if (m.TrainedParameters().size() + 1 != m.Parameters().size()) {
      return absl::InternalError("the lm_head is among the trained parameters");
    }
    DataParallelOptions o = Optimizer();
    o.norm_groups = {group};
    o.norm_weights = m.NormWeights();
    auto dp = DataParallel::Create(nullptr, m.TrainedParameters(), o);
    if (!dp.ok()) return dp.status();
    for (int step = 0; step < kSteps; ++step) {
      (*dp)->ZeroGrad();
      auto v = m.Values(batch.ids, batch.pos, batch.mask);
      if (!v.ok()) return v.status();
      if (step == 0 && (*v - first_values).abs().max().item<double>() > 1e-5) {
        return absl::InternalError("values off one process's");
      }
      ValueLoss(*v, batch.targets).backward();
      auto stats = (*dp)->Step(1.0, kLr);
      if (!stats.ok()) return stats.status();
    }
    auto full = m.GatherFull();
    if (!full.ok()) return full.status();
    const double d = MaxAbsDiffOrMinusOne(*full, ref);
    if (d < 0 || d > 1e-5) return absl::InternalError(absl::StrCat("weights ", d, " off one process's"));
    for (const auto& [name, t] : *full) {
      if (name == "lm_head.weight" && !t.equal(lm_head)) return absl::InternalError("the lm_head moved");
    }
    // The moments gather over the trained parameters only.
    auto moments = m.GatherFullOf(UnflattenLike((*dp)->exp_avg(), m.TrainedParameters()));
    if (!moments.ok()) return moments.status();
    if (moments->size() + 1 != full->size()) return absl::InternalError("moments gathered for the lm_head");
    return absl::OkStatus();
  });
}

TEST_CASE("a checkpoint gathered under one layout resumes under another") {
  const actor::ModelConfig c = SmallConfig("qwen3");
  const Batch batch = MakeBatch();
  const Checkpoint init{InitialWeights(c)};
  // Five steps in one process, against three under one layout and two more
  // under the other, both ways.
  const Run straight = TrainLayout(c, init, batch, 1, 1, false, 5)[0];
  REQUIRE(straight.checkpoint.steps == 5);
  for (auto [first, second] : {std::pair<int, int>{2, 1}, std::pair<int, int>{1, 2}}) {
    CAPTURE(first, second);
    const Run a = TrainLayout(c, init, batch, first, 1, false, 3)[0];
    REQUIRE(a.checkpoint.steps == 3);
    // The gathered moments are full-shaped and not zero.
    REQUIRE(a.checkpoint.exp_avg_sq.size() == init.weights.size());
    CHECK(a.checkpoint.exp_avg_sq[0].second.abs().sum().item<double>() > 0);
    for (const Run& b : TrainLayout(c, a.checkpoint, batch, second, 1, false, 2)) {
      CHECK(b.checkpoint.steps == 5);
      CHECK(b.norms[1] == Approx(straight.norms[4]).epsilon(1e-5));
      CHECK(MaxAbsDiff(b.weights, straight.weights) < 1e-5);
      CHECK(MaxAbsDiff(b.checkpoint.exp_avg, straight.checkpoint.exp_avg) < 1e-6);
    }
    // Resuming without the moments is measurably different: they matter.
    Checkpoint weights_only{a.checkpoint.weights};
    const Run fresh = TrainLayout(c, weights_only, batch, second, 1, false, 2)[0];
    CHECK(MaxAbsDiff(fresh.weights, straight.weights) > 1e-4);
  }
}

}  // namespace
}  // namespace rlmesh::learner
