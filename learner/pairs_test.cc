// Reward-model and DPO stages of the Trainer on tiny models (hidden 32, 2
// layers, char tokenizer): the reward model ranks held-out pairs, DPO raises
// the implicit-reward margin on held-out pairs, checkpoints round-trip with
// the value head and resume exactly, K=2 shards equal K=1, and paths
// outside the write roots are refused.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "actor/checkpoint.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "learner/checkpoint.h"
#include "learner/testing/tiny_experiment.h"
#include "learner/trainer.h"
#include "rollout/testing/tiny_model.h"
#include "actor/tokenizer.h"
#include "tasks/encoding.h"
#include "tasks/preferences.h"

namespace rlmesh::learner {
namespace {

ExperimentConfig Tiny(uint64_t seed = 7) { return testing::TinyExperiment(seed, 16); }

// A rule a tiny model can learn from few examples and that carries over to
// unseen pairs: the preferred response uses the digits 0-4, the other 5-9.
std::vector<PreferencePair> LowDigitPairs(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto digits = [&](int lo, int len) {
    std::string s;
    for (int i = 0; i < len; ++i) s += static_cast<char>('0' + lo + rng() % 5);
    return s;
  };
  std::vector<PreferencePair> out;
  for (int i = 0; i < n; ++i) {
    PreferencePair p;
    p.prompt = digits(0, 1) + "+" + digits(5, 1) + "=";
    p.chosen = digits(0, 1 + rng() % 3);
    p.rejected = digits(5, 1 + rng() % 3);
    out.push_back(p);
  }
  return out;
}

std::string WritePairs(const rlmesh::testing::TempDir& dir, const std::vector<PreferencePair>& pairs) {
  const std::string path = dir.File("pairs.jsonl");
  std::ofstream f(path);
  f << PreferencePairsToJsonl(pairs);
  return path;
}

Stage RmStage(int steps, int batch, double lr, const std::string& pairs, const std::string& output = "") {
  Stage s;
  auto* rm = s.mutable_reward_model();
  rm->set_steps(steps);
  rm->set_batch(batch);
  rm->mutable_optimizer()->set_lr(lr);
  rm->set_pairs_path(pairs);
  rm->set_output(output);
  return s;
}

Stage DpoStageOf(int steps, int batch, double lr, double beta, const std::string& pairs) {
  Stage s;
  auto* d = s.mutable_dpo();
  d->set_steps(steps);
  d->set_batch(batch);
  d->mutable_optimizer()->set_lr(lr);
  d->set_beta(beta);
  d->set_pairs_path(pairs);
  return s;
}

ConfigureRequest Request(const ExperimentConfig& e, int stage_index = 0, const std::string& ckpt = "") {
  ConfigureRequest r;
  *r.mutable_experiment() = e;
  r.set_stage_index(stage_index);
  r.set_world_size(1);
  r.set_checkpoint_dir(ckpt);
  return r;
}

TrainStepRequest Step(int64_t step) {
  TrainStepRequest r;
  r.set_step(step);
  r.set_from_task(true);
  return r;
}

using testing::MaxAbsDiff;

TEST_CASE("reward model ranks held-out pairs after training") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = Tiny();
  *e.add_stages() = RmStage(60, 16, 3e-3, WritePairs(dir, LowDigitPairs(200, 1)));
  const std::vector<PreferencePair> held_out = LowDigitPairs(100, 2);
  Trainer t;
  REQUIRE(t.Configure(Request(e)).ok());
  auto before = t.EvaluatePairs(held_out);
  REQUIRE(before.ok());
  double last_loss = 0;
  for (int s = 0; s < 60; ++s) {
    auto r = t.TrainStep(Step(s));
    REQUIRE(r.ok());
    REQUIRE(r->metrics().values().count("rm_accuracy") == 1);
    REQUIRE(r->metrics().values().count("margin") == 1);
    last_loss = r->metrics().values().at("loss");
  }
  auto after = t.EvaluatePairs(held_out);
  REQUIRE(after.ok());
  INFO("held-out rm_accuracy before " << before->at("rm_accuracy") << " after " << after->at("rm_accuracy"));
  CHECK(after->at("rm_accuracy") >= 0.9);
  CHECK(after->at("rm_margin") > before->at("rm_margin") + 0.5);
  CHECK(last_loss < std::log(2.0) / 2);
  // A reward model does not advance the policy version.
  CHECK(t.policy_version() == 0);
  CHECK(t.step() == 60);
}

TEST_CASE("DPO raises the held-out margin and accuracy; reference stays frozen") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = Tiny();
  *e.add_stages() = DpoStageOf(40, 16, 3e-3, 0.1, WritePairs(dir, LowDigitPairs(200, 1)));
  const std::vector<PreferencePair> held_out = LowDigitPairs(100, 2);
  Trainer t;
  REQUIRE(t.Configure(Request(e)).ok());
  auto before = t.EvaluatePairs(held_out);
  REQUIRE(before.ok());
  // Policy == reference at the start: every implicit reward is zero.
  CHECK(std::abs(before->at("reward_margin")) < 1e-6);
  CHECK(std::abs(before->at("loss") - std::log(2.0)) < 1e-5);
  double first_loss = 0, last_loss = 0;
  for (int s = 0; s < 40; ++s) {
    auto r = t.TrainStep(Step(s));
    REQUIRE(r.ok());
    for (const char* k : {"loss", "dpo_accuracy", "reward_margin", "chosen_reward", "rejected_reward"}) {
      REQUIRE(r->metrics().values().count(k) == 1);
    }
    if (s == 0) first_loss = r->metrics().values().at("loss");
    last_loss = r->metrics().values().at("loss");
  }
  CHECK(std::abs(first_loss - std::log(2.0)) < 1e-5);
  CHECK(last_loss < first_loss - 0.2);
  auto after = t.EvaluatePairs(held_out);
  REQUIRE(after.ok());
  INFO("held-out dpo_accuracy " << after->at("dpo_accuracy") << " margin " << after->at("reward_margin"));
  CHECK(after->at("dpo_accuracy") >= 0.9);
  CHECK(after->at("reward_margin") > 0.5);
  CHECK(after->at("chosen_reward") > after->at("rejected_reward"));
  CHECK(t.policy_version() == 40);
}

TEST_CASE("reward-model checkpoint round-trips with its value head; output folder") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = Tiny();
  // Stage 0: SFT (a policy without a head); stage 1: RM initialised from it.
  Stage sft;
  sft.mutable_sft()->set_steps(2);
  sft.mutable_sft()->set_batch(4);
  sft.mutable_sft()->mutable_optimizer()->set_lr(1e-3);
  *e.add_stages() = sft;
  *e.add_stages() = RmStage(4, 8, 3e-3, WritePairs(dir, LowDigitPairs(40, 1)), dir.File("rm_out"));
  std::string policy_dir;
  {
    Trainer s;
    REQUIRE(s.Configure(Request(e, 0, dir.File("sft"))).ok());
    for (int i = 0; i < 2; ++i) REQUIRE(s.TrainStep(Step(i)).ok());
    auto saved = s.Save();
    REQUIRE(saved.ok());
    policy_dir = saved->path();
  }
  auto policy = actor::LoadHfModel(policy_dir);
  REQUIRE(policy.ok());
  REQUIRE_FALSE((*policy)->config().value_head);

  ConfigureRequest req = Request(e, 1, dir.File("rm"));
  req.set_init_checkpoint(policy_dir);
  Trainer rm;
  REQUIRE(rm.Configure(req).ok());
  {
    // The body comes from the policy; the head is new.
    std::map<std::string, at::Tensor> p;
    for (auto& [n, w] : (*policy)->NamedParameters()) p[n] = w;
    bool has_score = false;
    for (auto& [n, w] : rm.PolicyParameters()) {
      if (n == "score.weight") {
        has_score = true;
        CHECK(w.abs().sum().item<double>() > 0);
        continue;
      }
      REQUIRE(p.count(n) == 1);
      CHECK(torch::equal(p[n], w));
    }
    CHECK(has_score);
  }
  for (int i = 0; i < 4; ++i) REQUIRE(rm.TrainStep(Step(i)).ok());
  auto saved = rm.Save();
  REQUIRE(saved.ok());
  REQUIRE(VerifyCheckpoint(saved->path()).ok());
  const auto eval_pairs = LowDigitPairs(20, 3);
  auto live = rm.EvaluatePairs(eval_pairs);
  REQUIRE(live.ok());
  for (const std::string& folder : {saved->path(), dir.File("rm_out")}) {
    auto back = actor::LoadHfModel(folder);
    REQUIRE(back.ok());
    CHECK((*back)->config().value_head);
    std::ifstream cfg(folder + "/config.json");
    std::string text((std::istreambuf_iterator<char>(cfg)), std::istreambuf_iterator<char>());
    CHECK(text.find("ForSequenceClassification") != std::string::npos);
    std::map<std::string, at::Tensor> b;
    for (auto& [n, w] : (*back)->NamedParameters()) b[n] = w;
    for (auto& [n, w] : rm.PolicyParameters()) {
      REQUIRE(b.count(n) == 1);
      CHECK(torch::equal(b[n], w));
    }
  }
  // A fresh trainer resumes the RM stage from the checkpoint: same step,
  // same scores.
  Trainer again;
  auto c = again.Configure(req);
  REQUIRE(c.ok());
  CHECK(c->step() == 4);
  auto resumed = again.EvaluatePairs(eval_pairs);
  REQUIRE(resumed.ok());
  CHECK(resumed->at("rm_margin") == live->at("rm_margin"));
}

TEST_CASE("DPO exact resume: N steps straight == N/2, Save, fresh trainer, N/2") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = Tiny();
  // Pairs from the task (pairs_path empty): 1-digit arithmetic near misses.
  *e.add_stages() = DpoStageOf(6, 4, 3e-3, 0.2, "");
  Trainer straight;
  REQUIRE(straight.Configure(Request(e)).ok());
  for (int s = 0; s < 6; ++s) REQUIRE(straight.TrainStep(Step(s)).ok());

  {
    Trainer first;
    REQUIRE(first.Configure(Request(e, 0, dir.File("ckpt"))).ok());
    for (int s = 0; s < 3; ++s) REQUIRE(first.TrainStep(Step(s)).ok());
    REQUIRE(first.Save().ok());
  }
  Trainer second;
  auto c = second.Configure(Request(e, 0, dir.File("ckpt")));
  REQUIRE(c.ok());
  REQUIRE(c->step() == 3);
  for (int s = 3; s < 6; ++s) REQUIRE(second.TrainStep(Step(s)).ok());
  CHECK(MaxAbsDiff(straight, second) == 0.0);
}

TEST_CASE("DPO on token-id pairs (the replay buffer's export) trains exactly as on the same pairs as text") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  std::vector<PreferencePair> text = LowDigitPairs(12, 5);
  std::vector<PreferencePair> ids = text;
  actor::CharTokenizer tok;
  for (PreferencePair& p : ids) {
    p.prompt_ids = EncodePrompt(tok, p.prompt);
    p.chosen_ids = EncodeResponse(tok, p.chosen);
    p.rejected_ids = EncodeResponse(tok, p.rejected);
    p.prompt = p.chosen = p.rejected = "";
  }
  const std::string text_path = dir.File("text.jsonl"), ids_path = dir.File("ids.jsonl");
  std::ofstream(text_path) << PreferencePairsToJsonl(text);
  std::ofstream(ids_path) << PreferencePairsToJsonl(ids);
  ExperimentConfig a = Tiny(), b = Tiny();
  *a.add_stages() = DpoStageOf(3, 4, 3e-3, 0.2, text_path);
  *b.add_stages() = DpoStageOf(3, 4, 3e-3, 0.2, ids_path);
  Trainer ta, tb;
  REQUIRE(ta.Configure(Request(a)).ok());
  REQUIRE(tb.Configure(Request(b)).ok());
  for (int s = 0; s < 3; ++s) {
    REQUIRE(ta.TrainStep(Step(s)).ok());
    REQUIRE(tb.TrainStep(Step(s)).ok());
  }
  CHECK(MaxAbsDiff(ta, tb) == 0.0);
  // An id the model does not have is refused by field.
  ids[0].chosen_ids.push_back(100000);
  std::ofstream(ids_path) << PreferencePairsToJsonl(ids);
  Trainer bad;
  auto s = bad.Configure(Request(b)).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("pairs_path: pair 0") != std::string::npos);
}

TEST_CASE("K=2 DPO shards (threads, FileStore) equal K=1 on the same global batch") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = Tiny();
  *e.add_stages() = DpoStageOf(3, 8, 3e-3, 0.1, WritePairs(dir, LowDigitPairs(40, 1)));
  Trainer single;
  REQUIRE(single.Configure(Request(e)).ok());
  for (int s = 0; s < 3; ++s) REQUIRE(single.TrainStep(Step(s)).ok());

  ExperimentConfig e2 = e;
  e2.mutable_learner()->set_micro_batch_tokens(24);  // accumulation on every rank
  Trainer ranks[2];
  auto results = testing::TrainShards(ranks, 2, Request(e2), dir.File("store"), 3, Step);
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  CHECK(MaxAbsDiff(single, ranks[0]) <= 1e-5);
  CHECK(MaxAbsDiff(ranks[0], ranks[1]) == 0.0);
}

// DPO and the reward model through the layouts that split the policy,
// against one process: 3 steps on 7 pairs a step, a pair per micro-batch,
// so that ranks with different pairs run different numbers of passes
// (ZeRO-3 and EP must run empty ones to match). lr 1e-3 as in trainer_test's
// TP case: AdamW's first steps move near-zero-gradient weights by up to lr
// in the direction their sign gives, which TP's summation order can flip at
// 1e-2. The reward model trains with weight decay, so that a layout which
// stepped its unused lm_head (plain DP leaves it out of the optimizer)
// would move it.
TEST_CASE("DPO and the reward model under learner.tp, learner.zero: 3 (alone and over tp=2), learner.ep and (DPO) "
          "learner.cp and learner.pp equal one process; checkpoints resume in one process") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = Tiny();
  enum Variant { kDpo, kMoeDpo, kRewardModel };
  const int variant = GENERATE(kDpo, kMoeDpo, kRewardModel);
  if (variant == kMoeDpo) {
    // A tiny Qwen3-MoE (4 experts, 2 a token) for expert parallelism.
    REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
    e.mutable_model()->set_init("checkpoint");
    e.mutable_model()->set_path(dir.File("moe"));
  }
  const std::string pairs = WritePairs(dir, LowDigitPairs(40, 1));
  if (variant == kRewardModel) {
    Stage rm = RmStage(5, 7, 1e-3, pairs);
    rm.mutable_reward_model()->mutable_optimizer()->set_weight_decay(0.5);
    *e.add_stages() = rm;
  } else {
    *e.add_stages() = DpoStageOf(5, 7, 1e-3, 0.1, pairs);
  }
  e.mutable_learner()->set_micro_batch_tokens(12);
  Trainer single, untrained;
  REQUIRE(single.Configure(Request(e, 0, dir.File("ckpt_plain"))).ok());
  REQUIRE(untrained.Configure(Request(e)).ok());
  for (int s = 0; s < 3; ++s) REQUIRE(single.TrainStep(Step(s)).ok());
  // The steps move the weights, or equal weights would prove nothing.
  CHECK(MaxAbsDiff(single, untrained) > 1e-3);

  auto layout = [&](int world, int tp, int zero, int ep, bool sp, const std::string& ckpt = "", int cp = 1,
                    int pp = 1) {
    ExperimentConfig l = e;
    l.mutable_learner()->set_cp(cp);
    l.mutable_learner()->set_pp(pp);
    l.mutable_learner()->set_tp(tp);
    l.mutable_learner()->set_zero(zero);
    l.mutable_learner()->set_ep(ep);
    l.mutable_learner()->set_sequence_parallel(sp);
    std::vector<Trainer> ranks(world);
    std::function<absl::Status(int, Trainer&)> save;
    if (!ckpt.empty()) save = [](int, Trainer& t) { return t.Save().status(); };
    auto results = testing::TrainShards(ranks.data(), world, Request(l, 0, ckpt), dir.File("store"), 3, Step, save);
    std::filesystem::remove_all(dir.File("store"));
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r << ": " << results[r].ToString());
      REQUIRE(results[r].ok());
    }
    return MaxAbsDiff(single, ranks[0]);
  };
  // The checkpoint in `ckpt` resumed in one plain process: its 4th step
  // equals the uninterrupted one's (DPO's reference is the stage's initial
  // policy again).
  auto resumes = [&](const std::string& ckpt) {
    Trainer resumed;
    auto c = resumed.Configure(Request(e, 0, ckpt));
    REQUIRE(c.ok());
    REQUIRE(c->step() == 3);
    REQUIRE(resumed.TrainStep(Step(3)).ok());
    REQUIRE(single.TrainStep(Step(3)).ok());
    CHECK(MaxAbsDiff(single, resumed) <= 1e-5);
  };
  if (variant == kMoeDpo) {
    SECTION("ep=2, and 2 groups of ep=2") {
      CHECK(layout(2, 1, 0, 2, false) <= 1e-5);
      CHECK(layout(4, 1, 0, 2, false) <= 1e-5);
    }
  } else {
    SECTION("zero=3 over 2 ranks, its checkpoint resumed in one plain process") {
      CHECK(layout(2, 1, 3, 1, false, dir.File("ckpt_zero3")) <= 1e-5);
      resumes(dir.File("ckpt_zero3"));
    }
    SECTION("tp=2 x dp=2 with sequence parallelism") { CHECK(layout(4, 2, 0, 1, true) <= 1e-5); }
    SECTION("tp=2, its checkpoint resumed in one plain process") {
      CHECK(layout(2, 2, 0, 1, false, dir.File("ckpt_tp")) <= 1e-5);
      resumes(dir.File("ckpt_tp"));
    }
    SECTION("tp=2 x dp=2 x zero=3, its checkpoint resumed in one plain process") {
      CHECK(layout(4, 2, 3, 1, false, dir.File("ckpt_tp_zero3")) <= 1e-5);
      resumes(dir.File("ckpt_tp_zero3"));
    }
  }
  if (variant == kDpo) {
    // Each rank scores its zig-zag share of every sequence; the pairs'
    // sums are taken over the context ranks.
    SECTION("cp=2, its checkpoint resumed in one plain process") {
      CHECK(layout(2, 1, 0, 1, false, dir.File("ckpt_cp"), 2) <= 1e-5);
      resumes(dir.File("ckpt_cp"));
    }
    SECTION("cp=2 x dp=2 with ZeRO-1") { CHECK(layout(4, 1, 1, 1, false, "", 2) <= 1e-5); }
    SECTION("cp=2 x tp=2") { CHECK(layout(4, 2, 0, 1, false, "", 2) <= 1e-5); }
    // The reference's sums on every stage; the last stage takes the losses
    // in the schedule.
    SECTION("pp=2, its checkpoint resumed in one plain process") {
      CHECK(layout(2, 1, 0, 1, false, dir.File("ckpt_pp"), 1, 2) <= 1e-5);
      resumes(dir.File("ckpt_pp"));
    }
    SECTION("pp=2 x dp=2 with ZeRO-1") { CHECK(layout(4, 1, 1, 1, false, "", 1, 2) <= 1e-5); }
    SECTION("pp=2 x tp=2") { CHECK(layout(4, 2, 0, 1, false, "", 1, 2) <= 1e-5); }
  }
}

TEST_CASE("DPO through LoRA adapters: the reference is the base with them off; the base stays bit for bit") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = Tiny();
  e.mutable_model()->mutable_lora()->set_rank(8);
  e.mutable_model()->mutable_lora()->set_alpha(16);
  *e.add_stages() = DpoStageOf(40, 16, 3e-2, 0.1, WritePairs(dir, LowDigitPairs(200, 1)));
  const std::vector<PreferencePair> held_out = LowDigitPairs(100, 2);
  Trainer t;
  REQUIRE(t.Configure(Request(e)).ok());
  const auto base = t.PolicyParameters();
  std::vector<at::Tensor> frozen;
  for (const auto& [name, p] : base) frozen.push_back(p.clone());
  auto before = t.EvaluatePairs(held_out);
  REQUIRE(before.ok());
  CHECK(std::abs(before->at("reward_margin")) < 1e-6);
  double first_loss = 0, last_loss = 0;
  for (int s = 0; s < 40; ++s) {
    auto r = t.TrainStep(Step(s));
    REQUIRE(r.ok());
    if (s == 0) first_loss = r->metrics().values().at("loss");
    last_loss = r->metrics().values().at("loss");
  }
  auto after = t.EvaluatePairs(held_out);
  REQUIRE(after.ok());
  INFO("loss " << first_loss << " -> " << last_loss << "; held-out margin " << after->at("reward_margin")
               << " accuracy " << after->at("dpo_accuracy"));
  // Were the reference the policy itself (adapters on), every implicit
  // reward would stay 0 and the loss ln 2. The random base's frozen head
  // bounds how far the log-probs move (about 0.69 -> 0.65, margin 0.09).
  CHECK(std::abs(first_loss - std::log(2.0)) < 1e-5);
  CHECK(last_loss < first_loss - 0.02);
  CHECK(after->at("reward_margin") > 0.03);
  CHECK(after->at("dpo_accuracy") >= 0.9);
  const auto now = t.PolicyParameters();
  for (size_t i = 0; i < frozen.size(); ++i) CHECK(torch::equal(now[i].second, frozen[i]));
}

TEST_CASE("reward_model / dpo configuration errors name the field") {
  rlmesh::testing::TempDir dir;
  auto code_and_message = [](const ExperimentConfig& e) {
    Trainer t;
    return t.Configure(Request(e)).status();
  };
  {
    ExperimentConfig e = Tiny();
    *e.add_stages() = DpoStageOf(2, 4, 1e-3, -1.0, "");
    absl::Status s = code_and_message(e);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("stages[0].dpo.beta") != std::string::npos);
  }
  {
    ExperimentConfig e = Tiny();
    *e.add_stages() = RmStage(0, 4, 1e-3, "");
    absl::Status s = code_and_message(e);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("stages[0].reward_model.steps") != std::string::npos);
  }
  {
    ExperimentConfig e = Tiny();
    *e.add_stages() = RmStage(2, 4, 1e-3, dir.File("missing.jsonl"));
    absl::Status s = code_and_message(e);
    CHECK(s.code() == absl::StatusCode::kNotFound);
    CHECK(s.message().find("stages[0].reward_model.pairs_path") != std::string::npos);
  }
  {
    // TrainStep with groups is refused: pairs come from the stage.
    ExperimentConfig e = Tiny();
    *e.add_stages() = DpoStageOf(2, 4, 1e-3, 0.1, "");
    Trainer t;
    REQUIRE(t.Configure(Request(e)).ok());
    TrainStepRequest r;
    r.set_step(0);
    r.mutable_groups();
    CHECK(t.TrainStep(r).status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(t.step() == 0);
  }
}

TEST_CASE("write roots: checkpoint folders, save paths and outputs outside them are refused by name") {
  actor::ConfigureThreads(1);
  rlmesh::testing::TempDir dir;
  const std::string runs = dir.File("runs");
  std::filesystem::create_directories(runs);
  TrainerOptions o;
  o.write_roots = {runs};
  ExperimentConfig e = Tiny();
  Stage sft;
  sft.mutable_sft()->set_steps(2);
  sft.mutable_sft()->set_batch(4);
  sft.mutable_sft()->mutable_optimizer()->set_lr(1e-3);
  *e.add_stages() = sft;
  *e.add_stages() = RmStage(2, 8, 3e-3, WritePairs(dir, LowDigitPairs(16, 1)), dir.File("rm_out"));

  Trainer t(o);
  auto outside = t.Configure(Request(e, 0, runs + "/../elsewhere/ckpt"));
  REQUIRE_FALSE(outside.ok());
  CHECK(outside.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(outside.status().message()).rfind("checkpoint_dir: ", 0) == 0);
  REQUIRE(t.Configure(Request(e, 0, runs + "/ckpt")).ok());
  REQUIRE(t.TrainStep(Step(0)).ok());
  auto escape = t.Save(runs + "/weights/../../elsewhere/v1");
  REQUIRE_FALSE(escape.ok());
  CHECK(escape.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(escape.status().message()).rfind("path: ", 0) == 0);
  CHECK_FALSE(std::filesystem::exists(dir.File("elsewhere")));
  CHECK(t.Save(runs + "/weights/v1").ok());
  CHECK(t.Save().ok());

  // The reward model's output is checked at Configure, before any training.
  auto rm = t.Configure(Request(e, 1, runs + "/rm"));
  REQUIRE_FALSE(rm.ok());
  CHECK(rm.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(rm.status().message()).rfind("experiment.stages[1].reward_model.output: ", 0) == 0);
  o.write_roots.push_back(dir.File("rm_out"));
  Trainer allowed(o);
  CHECK(allowed.Configure(Request(e, 1, runs + "/rm")).ok());
}

}  // namespace
}  // namespace rlmesh::learner
