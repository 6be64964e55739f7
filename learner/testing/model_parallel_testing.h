#pragma once

// The fixture the learner's model-parallel tests share
// (tensor_parallel_training_test, fully_sharded_test, expert_parallel_test):
// the loss and optimizer settings, the one-process reference run every
// layout must reproduce, and the threads that run a dp x tp layout. The
// model, batch and comparisons come from parallel/testing/model_testing.h.

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "actor/logprobs.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "dist/gloo.h"
#include "dist/store.h"
#include "learner/data_parallel.h"
#include "parallel/testing/model_testing.h"

namespace rlmesh::learner::model_parallel_testing {

// The model, batch and comparisons of parallel/testing/model_testing.h.
using parallel::model_testing::AbsDiffMax;
using parallel::model_testing::Batch;
using parallel::model_testing::InitialWeights;
using parallel::model_testing::MakeBatch;
using parallel::model_testing::MaxAbsDiff;
using parallel::model_testing::MaxAbsDiffOrMinusOne;
using parallel::model_testing::Named;
using parallel::model_testing::OnRanks;
using parallel::model_testing::Rows;
using parallel::model_testing::SmallConfig;

// Token-mean of -log p plus an entropy bonus: both heads of the
// vocabulary-parallel log-softmax carry gradient.
inline at::Tensor Loss(const actor::TokenLogProbsOutput& out, const at::Tensor& targets) {
  auto valid = targets.ge(0).to(at::kFloat);
  auto w = valid.sum();
  return -(out.logprobs * valid).sum() / w - 0.01 * (out.entropy * valid).sum() / w;
}

inline double Weight(const Batch& b) { return b.targets.ge(0).sum().item<double>(); }

inline DataParallelOptions Optimizer() {
  DataParallelOptions o;
  o.grad_clip = 0.5;  // below the first step's norm: clipping acts
  o.adamw.weight_decay = 0.01;
  return o;
}

constexpr int kSteps = 3;
constexpr double kLr = 3e-3;

// A checkpoint in the layout-free (Hugging Face) form: weights and AdamW
// moments under parameter names, and the optimizer's step count.
struct Checkpoint {
  Named weights, exp_avg, exp_avg_sq;
  int64_t steps = 0;
};

struct Run {
  std::vector<double> losses, norms;
  Named weights;
  Checkpoint checkpoint;
};

// `replay` (MoE models): the experts every MoE layer must use, replayed
// instead of routed (actor::MoeRouting::replay); empty = routed.
inline Run Reference(const actor::ModelConfig& c, const Named& init, const Batch& batch,
                     const std::vector<at::Tensor>& replay = {}) {
  actor::Transformer m(c);
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> src(init.begin(), init.end());
    for (auto& [name, p] : m->NamedParameters()) p.copy_(src.at(name));
  }
  auto dp = DataParallel::Create(nullptr, m->parameters(), Optimizer());
  REQUIRE(dp.ok());
  actor::MoeRouting routing;
  routing.replay = replay;
  if (!replay.empty()) m->set_routing(&routing);
  Run r;
  for (int step = 0; step < kSteps; ++step) {
    (*dp)->ZeroGrad();
    auto out = actor::TokenLogProbs(m, batch.ids, batch.pos, batch.targets, /*chunk_size=*/4, 0.9, batch.mask);
    REQUIRE(out.ok());
    at::Tensor loss = Loss(*out, batch.targets);
    loss.backward();
    auto stats = (*dp)->Step(1.0, kLr);
    REQUIRE(stats.ok());
    r.losses.push_back(loss.item<double>());
    r.norms.push_back(stats->grad_norm);
  }
  m->set_routing(nullptr);
  r.weights = m->NamedParameters();
  return r;
}

// A value-head model's loss (a critic's or reward model's stand-in): the
// token-mean of (value - 0.5)^2 over the scored tokens.
inline at::Tensor ValueLoss(const at::Tensor& values, const at::Tensor& targets) {
  auto valid = targets.ge(0).to(at::kFloat);
  return ((values - 0.5).pow(2) * valid).sum() / valid.sum();
}

// What one process does with a value-head model `c`: kSteps steps of
// ValueLoss from `init` with its lm_head out of the optimizer (as the
// learner leaves a reward model's); the first step's values in
// `first_values`.
inline Named ValueReference(const actor::ModelConfig& c, const Named& init, const Batch& batch,
                            at::Tensor* first_values) {
  actor::Transformer m(c);
  std::vector<at::Tensor> trained;
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> src(init.begin(), init.end());
    for (auto& [name, p] : m->NamedParameters()) {
      p.copy_(src.at(name));
      if (name != "lm_head.weight") trained.push_back(p);
    }
  }
  auto dp = DataParallel::Create(nullptr, trained, Optimizer());
  REQUIRE(dp.ok());
  for (int step = 0; step < kSteps; ++step) {
    (*dp)->ZeroGrad();
    at::Tensor v = m->Values(batch.ids, batch.pos, batch.mask);
    if (step == 0) *first_values = v.detach().clone();
    ValueLoss(v, batch.targets).backward();
    REQUIRE((*dp)->Step(1.0, kLr).ok());
  }
  return m->NamedParameters();
}

// The runs of ranks started with std::async, in rank order; each result has
// a `run` (absl::StatusOr<Run>) and keeps its groups alive until all ranks
// are done. Fails the test when a rank is not done in two minutes or failed.
template <typename RankResult>
std::vector<Run> Collect(std::vector<std::future<RankResult>>& futures) {
  std::vector<RankResult> results;
  for (auto& f : futures) {
    REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    results.push_back(f.get());
  }
  std::vector<Run> out;
  for (RankResult& r : results) {
    INFO(r.run.status().ToString());
    REQUIRE(r.run.ok());
    out.push_back(*r.run);
  }
  return out;
}

// The Gloo groups one test rank joins, held until the holder dies (after
// every rank is done: a group destroyed early would break the others').
struct HeldGroups {
  std::vector<c10::intrusive_ptr<c10d::Backend>> held;

  // Rank `group_rank` of a Gloo group of `size` ranks with keys under
  // `prefix` of `store` into `*group` (left null for one rank), held here.
  absl::Status Join(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int group_rank,
                    int size, c10::intrusive_ptr<c10d::Backend>* group) {
    if (size == 1) return absl::OkStatus();
    dist::GlooGroupOptions gloo;
    gloo.timeout_ms = 60'000;
    auto g = dist::CreateGlooGroup(dist::WithPrefix(store, prefix), group_rank, size, gloo);
    if (!g.ok()) return g.status();
    *group = *g;
    held.push_back(*g);
    return absl::OkStatus();
  }
};

// What one rank of a layout returns; the groups die only after every rank
// is done.
struct LayoutRankResult {
  absl::StatusOr<Run> run = absl::UnknownError("not run");
  HeldGroups groups;
};

// Runs `train(rows, tp_group, dp_group)` on dp x tp ranks, a thread each
// (rank = d * tp + t), over one fresh HashStore: rank d * tp + t joins the
// tensor-parallel group of replica d (keys under "tp<d>") and the
// data-parallel group of TP rank t ("dp<t>"), each null where it has one
// rank. Replica d trains rows [d * (B / dp), ...), the last replica the
// remainder, and its TP ranks the same rows. The runs in rank order, as
// Collect returns them.
inline std::vector<Run> TrainOnLayout(
    const Batch& batch, int dp, int tp,
    const std::function<absl::StatusOr<Run>(const Batch&, c10::intrusive_ptr<c10d::Backend>,
                                            c10::intrusive_ptr<c10d::Backend>)>& train) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<LayoutRankResult>> futures;
  const int64_t rows = batch.ids.size(0);
  for (int rank = 0; rank < dp * tp; ++rank) {
    futures.push_back(std::async(std::launch::async, [=]() {
      LayoutRankResult r;
      const int d = rank / tp, t = rank % tp;
      c10::intrusive_ptr<c10d::Backend> tp_group, dp_group;
      absl::Status joined = r.groups.Join(store, absl::StrCat("tp", d), t, tp, &tp_group);
      if (joined.ok()) joined = r.groups.Join(store, absl::StrCat("dp", t), d, dp, &dp_group);
      if (!joined.ok()) {
        r.run = joined;
        return r;
      }
      const int64_t per = rows / dp, begin = d * per, n = d == dp - 1 ? rows - begin : per;
      r.run = train(Rows(batch, begin, n), tp_group, dp_group);
      return r;
    }));
  }
  return Collect(futures);
}

}  // namespace rlmesh::learner::model_parallel_testing
