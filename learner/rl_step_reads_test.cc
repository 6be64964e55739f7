// What an RL step reads back to the host per micro-batch. On a GPU every
// .item() is a synchronisation (it waits for all the work queued before
// it), so the step's own scalars (loss weights, mismatch sums, the largest
// behaviour difference, over-long and router metrics) are read in one copy
// per mini-batch and one at the step's end, never per micro-batch. Counted
// here on the CPU through LibTorch's RecordFunction, which sees every
// .item() (aten::_local_scalar_dense) whatever the device: the same step
// split into one micro-batch per row may make more .item() calls than as
// one micro-batch only by its extra forwards' own (the id checks of
// actor::TokenLogProbs).

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actor/logprobs.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "learner/testing/sampled_groups.h"
#include "learner/testing/tiny_experiment.h"
#include "learner/trainer.h"
#include "tasks/encoding.h"
#include "tasks/task.h"

namespace rlmesh::learner {
namespace {

std::atomic<int64_t> g_items{0};

// Counts the .item() calls of every thread while alive.
class ItemCounter {
 public:
  ItemCounter()
      : handle_(at::addGlobalCallback(at::RecordFunctionCallback(&OnStart).scopes({at::RecordScope::FUNCTION}))) {
    g_items = 0;
  }
  ~ItemCounter() { at::removeCallback(handle_); }
  int64_t count() const { return g_items.load(); }

 private:
  static std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
    if (std::strcmp(fn.name(), "aten::_local_scalar_dense") == 0) ++g_items;
    return nullptr;
  }
  at::CallbackHandle handle_;
};

actor::Transformer& Policy(Trainer& t) { return *static_cast<actor::Transformer*>(t.policy_model()); }

// .item() calls of one TrainStep of `groups` on a fresh trainer of `e`.
int64_t ItemsOfStep(const ExperimentConfig& e, const TrainerOptions& options, const GroupList& groups) {
  Trainer t(options);
  ConfigureRequest c;
  *c.mutable_experiment() = e;
  c.set_world_size(1);
  const absl::Status configured = t.Configure(c).status();
  INFO(configured.ToString());
  REQUIRE(configured.ok());
  TrainStepRequest req;
  req.set_step(0);
  *req.mutable_groups() = groups;
  ItemCounter items;
  REQUIRE(t.TrainStep(req).ok());
  return items.count();
}

// .item() calls of one policy forward (actor::TokenLogProbs) on `model`.
int64_t ItemsOfForward(actor::Transformer& model) {
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(std::vector<int64_t>{3, 4, 5}, torch::kLong).unsqueeze(0);
  auto pos = torch::arange(3, torch::kLong).unsqueeze(0);
  ItemCounter items;
  REQUIRE(actor::TokenLogProbs(model, ids, pos, ids, /*chunk_size=*/64, /*temperature=*/1.0).ok());
  return items.count();
}

TEST_CASE("the counter sees every .item()") {
  ItemCounter items;
  (void)torch::ones({1}).item<double>();
  (void)torch::ones({2}).sum().item<int64_t>();
  CHECK(items.count() == 2);
}

TEST_CASE("a micro-batch makes no .item() call of the step's own: one micro-batch per row adds only the forwards'") {
  actor::ConfigureThreads(2);
  ExperimentConfig base = testing::TinyExperiment(7, 8);
  Trainer sampler;
  {
    ConfigureRequest c;
    *c.mutable_experiment() = base;
    Stage s;
    s.mutable_grpo()->mutable_rl()->set_steps(1);
    s.mutable_grpo()->mutable_rl()->set_prompts_per_step(4);
    s.mutable_grpo()->mutable_rl()->mutable_optimizer()->set_lr(1e-2);
    *c.mutable_experiment()->add_stages() = s;
    c.set_world_size(1);
    const absl::Status st = sampler.Configure(c).status();
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  int i = 0;
  // 4 groups of 4 with varying rewards: 16 rows, behaviour log-probs on.
  const GroupList groups = testing::SampleGroups(Policy(sampler), testing::TaskPrompts(base, 4), 4, 1.0f, 5,
                                                 [&](const std::vector<int64_t>&) { return double(i++ % 3); });
  const int64_t rows = 16;
  const int64_t forward = ItemsOfForward(Policy(sampler));
  struct Case {
    const char* name;
    std::function<void(RlStage*)> set;
    bool recompute_old;  // a no-grad forward per micro-batch too
  };
  const std::vector<Case> cases = {
      {"token-mean, old log-probs from the training forward (mismatch per micro-batch)", [](RlStage*) {}, false},
      {"seq-mean-token-mean, over-long penalty, old log-probs recomputed",
       [](RlStage* rl) {
         rl->set_loss_agg("seq-mean-token-mean");
         rl->set_overlong_buffer(2);
         rl->set_overlong_penalty(0.5);
       },
       true},
      {"icepop (masks before the loop), seq-mean-token-sum", [](RlStage* rl) {
         rl->mutable_mismatch()->set_mode("icepop");
         rl->set_loss_agg("seq-mean-token-sum");
       }, true},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    ExperimentConfig e = base;
    Stage s;
    RlStage* rl = s.mutable_grpo()->mutable_rl();
    rl->set_steps(1);
    rl->set_prompts_per_step(4);
    rl->mutable_optimizer()->set_lr(1e-2);
    c.set(rl);
    *e.add_stages() = s;
    TrainerOptions options;
    options.pack_rl = TrainerOptions::RlPacking::kOff;  // one row per micro-batch below
    options.recompute_old_logprobs = c.recompute_old;
    ExperimentConfig one = e, each = e;
    one.mutable_learner()->set_micro_batch_tokens(100000);
    each.mutable_learner()->set_micro_batch_tokens(1);  // every row alone
    const int64_t items_one = ItemsOfStep(one, options, groups);
    const int64_t items_each = ItemsOfStep(each, options, groups);
    const int64_t forwards_per_micro = c.recompute_old ? 2 : 1;
    INFO("items: one micro-batch " << items_one << ", one per row " << items_each << "; a forward " << forward);
    CHECK(items_each - items_one == (rows - 1) * forwards_per_micro * forward);
  }
}

}  // namespace
}  // namespace rlmesh::learner
