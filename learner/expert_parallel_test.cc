// Expert parallelism must reproduce one process: Gloo groups on threads over
// a HashStore, each rank an ExpertParallelModel training on its own rows
// (1 and 2 of the batch's 3), three AdamW steps with clipping active; the
// global loss, the gradient norms and the gathered weights must equal the
// whole model trained on all rows within 1e-5 (fp32), for Qwen3-MoE and for
// Qwen2-MoE with a shared expert, routed freely and under routing replay.

#include "learner/expert_parallel.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <future>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "learner/testing/model_parallel_testing.h"

namespace rlmesh::learner {
namespace {

using namespace model_parallel_testing;  // NOLINT: the shared fixture

actor::ModelConfig MoeConfig(const std::string& arch) {
  actor::ModelConfig c = SmallConfig(arch);
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = arch == "qwen3_moe";
  if (arch == "qwen2_moe") c.shared_expert_intermediate_size = 24;
  return c;
}

// Expert ids [B*T, k] for every MoE layer of `c`, seeded; null = route.
std::vector<at::Tensor> Replay(const actor::ModelConfig& c, int64_t tokens) {
  at::manual_seed(17);
  std::vector<at::Tensor> out;
  for (int64_t l = 0; l < c.NumMoeLayers(); ++l) {
    // Two distinct experts per token: a random one and its neighbour.
    at::Tensor first = at::randint(0, c.num_experts, {tokens, 1}, at::kLong);
    out.push_back(at::cat({first, (first + 1) % c.num_experts}, 1));
  }
  return out;
}

struct RankResult {
  absl::StatusOr<Run> run = absl::UnknownError("not run");
  HeldGroups groups;
  // This rank's local weight and loss per step (the global loss is their
  // weighted mean).
  double weight = 0;
};

// `groups` expert-parallel groups of `ep` ranks: rank w is rank w % ep of
// group w / ep, and rank w / ep of the data group of the ranks holding the
// same experts. One group: rank 0 trains the first row, rank 1 the other
// two; several: rank w trains row w.
std::vector<RankResult> TrainExpertParallel(const actor::ModelConfig& c, const Named& init, const Batch& batch,
                                            int ep, const std::vector<at::Tensor>& replay, int groups = 1) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<RankResult>> futures;
  const int64_t rows = batch.ids.size(0), T = batch.ids.size(1);
  const int world = ep * groups;
  if (groups > 1) REQUIRE(rows == world);
  for (int rank = 0; rank < world; ++rank) {
    futures.push_back(std::async(std::launch::async, [=]() {
      RankResult r;
      c10::intrusive_ptr<c10d::Backend> group, data;
      absl::Status joined = r.groups.Join(store, absl::StrCat("ep", rank / ep), rank % ep, ep, &group);
      if (joined.ok()) joined = r.groups.Join(store, absl::StrCat("edp", rank % ep), rank / ep, groups, &data);
      if (!joined.ok()) {
        r.run = joined;
        return r;
      }
      const int64_t begin = groups > 1 ? rank : rank == 0 ? 0 : 1;
      const int64_t n = groups > 1 ? 1 : rank == 0 ? 1 : rows - 1;
      const Batch mine = world == 1 ? batch : Rows(batch, begin, n);
      ExpertParallelOptions o;
      o.adamw = Optimizer().adamw;
      o.grad_clip = Optimizer().grad_clip;
      o.data_group = data;
      auto model = ExpertParallelModel::Create(c, group, o);
      if (!model.ok()) {
        r.run = model.status();
        return r;
      }
      absl::Status s = (*model)->LoadFromFull(init);
      if (!s.ok()) {
        r.run = s;
        return r;
      }
      actor::MoeRouting routing;
      for (const at::Tensor& t : replay) {
        routing.replay.push_back(world == 1 ? t : t.narrow(0, begin * T, n * T).contiguous());
      }
      if (!replay.empty()) (*model)->model()->set_routing(&routing);
      r.weight = Weight(mine);
      Run run;
      for (int step = 0; step < kSteps; ++step) {
        (*model)->ZeroGrad();
        s = (*model)->PrepareBackward(r.weight);
        if (!s.ok()) {
          r.run = s;
          return r;
        }
        auto out = actor::TokenLogProbs((*model)->model(), mine.ids, mine.pos, mine.targets, 4, 0.9, mine.mask);
        if (!out.ok()) {
          r.run = out.status();
          return r;
        }
        at::Tensor loss = Loss(*out, mine.targets);
        loss.backward();
        auto stats = (*model)->Step(kLr);
        if (!stats.ok()) {
          r.run = stats.status();
          return r;
        }
        run.losses.push_back(loss.item<double>());
        run.norms.push_back(stats->grad_norm);
      }
      (*model)->model()->set_routing(nullptr);
      auto full = (*model)->GatherFull();
      if (!full.ok()) {
        r.run = full.status();
        return r;
      }
      run.weights = *full;
      r.run = run;
      return r;
    }));
  }
  std::vector<RankResult> out;
  for (auto& f : futures) {
    REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    out.push_back(f.get());
  }
  return out;
}

// One group of 2 (3 rows), or `groups` groups of 2 (a row each).
void CheckEqualsWholeModel(const std::string& arch, bool replayed, int groups = 1) {
  CAPTURE(arch, replayed, groups);
  const actor::ModelConfig c = MoeConfig(arch);
  Batch batch = MakeBatch();
  if (groups > 1) {
    // 2 x groups rows: the three, then the first ones again.
    Batch more = Rows(batch, 0, 2 * groups - 3);
    batch = {at::cat({batch.ids, more.ids}), at::cat({batch.pos, more.pos}), at::cat({batch.targets, more.targets}),
             at::cat({batch.mask, more.mask})};
  }
  const Named init = InitialWeights(c);
  const std::vector<at::Tensor> replay = replayed ? Replay(c, batch.ids.numel()) : std::vector<at::Tensor>{};
  const Run ref = Reference(c, init, batch, replay);
  // The steps must move the weights, or equal weights would prove nothing.
  REQUIRE(MaxAbsDiff(ref.weights, init) > 1e-3);
  std::vector<RankResult> ranks = TrainExpertParallel(c, init, batch, 2, replay, groups);
  double total = 0;
  for (const RankResult& r : ranks) {
    INFO(r.run.status().ToString());
    REQUIRE(r.run.ok());
    total += r.weight;
  }
  for (int step = 0; step < kSteps; ++step) {
    CAPTURE(step);
    double global_loss = 0;
    for (const RankResult& r : ranks) {
      global_loss += r.run->losses[step] * r.weight / total;
      CHECK(std::abs(r.run->norms[step] - ref.norms[step]) < 1e-5);
    }
    CHECK(std::abs(global_loss - ref.losses[step]) < 1e-5);
  }
  for (const RankResult& r : ranks) CHECK(MaxAbsDiff(r.run->weights, ref.weights) < 1e-5);
}

TEST_CASE("ep=2 equals one process on all the rows: Qwen3-MoE and Qwen2-MoE (shared expert), routed and replayed") {
  at::set_num_threads(1);
  for (const char* arch : {"qwen3_moe", "qwen2_moe"}) {
    for (bool replayed : {false, true}) CheckEqualsWholeModel(arch, replayed);
  }
}

TEST_CASE("ep=2 x 2 groups (expert data parallelism) equals one process on all the rows") {
  at::set_num_threads(1);
  CheckEqualsWholeModel("qwen3_moe", false, 2);
  CheckEqualsWholeModel("qwen2_moe", true, 2);
}

TEST_CASE("ep=1 is the whole model: every expert local, no exchange") {
  at::set_num_threads(1);
  const actor::ModelConfig c = MoeConfig("qwen3_moe");
  const Batch batch = MakeBatch();
  const Named init = InitialWeights(c);
  const Run ref = Reference(c, init, batch);
  std::vector<RankResult> one = TrainExpertParallel(c, init, batch, 1, {});
  REQUIRE(one[0].run.ok());
  CHECK(MaxAbsDiff(one[0].run->weights, ref.weights) < 1e-6);
}

TEST_CASE("each rank holds its experts only; refusals are by name") {
  const actor::ModelConfig c = MoeConfig("qwen3_moe");
  OnRanks(2, [&](int rank, c10::intrusive_ptr<c10d::Backend> g) -> absl::Status {
    auto model = ExpertParallelModel::Create(c, g);
    if (!model.ok()) return model.status();
    for (auto& [name, p] : (*model)->NamedParameters()) {
      const int e = ExpertOf(name);
      if (e >= 0 && e / 2 != rank) return absl::InternalError(absl::StrCat(name, " held by rank ", rank));
    }
    int64_t held = 0;
    for (auto& [name, p] : (*model)->model()->NamedParameters()) {
      if (ExpertOf(name) >= 0) held += p.numel();
    }
    // Half of the 2 layers x 4 experts x 3 matrices of 32 x 16.
    if (held != 2 * 2 * 3 * 32 * 16) return absl::InternalError(absl::StrCat("expert elements held: ", held));
    return absl::OkStatus();
  });
  CHECK(ExpertOf("model.layers.3.mlp.experts.5.up_proj.weight") == 5);
  CHECK(ExpertOf("model.layers.3.mlp.shared_expert.up_proj.weight") == -1);
  CHECK(ExpertOf("model.layers.3.mlp.gate.weight") == -1);
  absl::Status dense = ValidateExpertParallel(SmallConfig("llama"), 2);
  CHECK(dense.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(dense.message()).find("expert parallelism needs MoE layers") != std::string::npos);
  absl::Status odd = ValidateExpertParallel(c, 3);
  CHECK(std::string(odd.message()).find("model.num_experts (4) is not divisible by ep (3)") != std::string::npos);
}

}  // namespace
}  // namespace rlmesh::learner
