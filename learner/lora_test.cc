// LoRA training in the Trainer (experiment.model.lora): GRPO steps against a
// reference computed here with LibTorch's own AdamW on a model built here,
// the base weights frozen bit for bit, the KL reference as the base with the
// adapters off, SFT learning through adapters alone, PEFT-format checkpoints
// that resume bit for bit, and the tensors a weight sync sends.
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "actor/checkpoint.h"
#include "actor/lora.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "learner/advantages.h"
#include "learner/losses.h"
#include "learner/testing/sampled_groups.h"
#include "learner/testing/tiny_experiment.h"
#include "learner/trainer.h"
#include "tasks/encoding.h"
#include "tasks/task.h"

namespace rlmesh::learner {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

actor::Transformer& Policy(Trainer& t) { return *static_cast<actor::Transformer*>(t.policy_model()); }

ConfigureRequest Request(const ExperimentConfig& e, const std::string& ckpt_dir = "") {
  ConfigureRequest r;
  *r.mutable_experiment() = e;
  r.set_world_size(1);
  r.set_checkpoint_dir(ckpt_dir);
  return r;
}

ExperimentConfig LoraGrpo(int steps, double kl_coef) {
  ExperimentConfig e = testing::TinyExperiment(7, 8);
  auto* lora = e.mutable_model()->mutable_lora();
  lora->set_rank(4);
  lora->set_alpha(8);
  // A random and B zero: the first step moves B only, the second both.
  lora->set_init("gaussian");
  Stage s;
  auto* rl = s.mutable_grpo()->mutable_rl();
  rl->set_steps(steps);
  rl->set_prompts_per_step(4);
  rl->mutable_optimizer()->set_lr(0.02);
  // An eps above the gradients' rounding error: with 1e-8, an element whose
  // gradient is near zero moves by +-lr on its first step, so float
  // summation order alone would decide its sign.
  rl->mutable_optimizer()->set_eps(1e-4);
  rl->mutable_kl()->set_coef(kl_coef);
  rl->mutable_mismatch()->set_mode("none");
  *e.add_stages() = s;
  return e;
}

Named Clone(const Named& in) {
  Named out;
  for (const auto& [name, t] : in) out.emplace_back(name, t.detach().clone());
  return out;
}

double MaxDiff(const Named& a, const Named& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].first == b[i].first);
    d = std::max(d, (a[i].second - b[i].second).abs().max().item<double>());
  }
  return d;
}

// 4 samples of each of the task's first 4 prompts from `model`, rewarded by
// the sum of the response's token ids mod 5 (any reward that varies within
// a group gives the step a gradient).
GroupList Rollout(actor::Transformer& model, const ExperimentConfig& e, uint64_t seed) {
  auto task = MakeTask(e.task(), e.seed());
  REQUIRE(task.ok());
  actor::CharTokenizer tok;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(EncodePrompt(tok, (*task)->train()[i].prompt));
  return testing::SampleGroups(model, prompts, 4, 1.0f, seed, [](const std::vector<int64_t>& tokens) {
    int64_t sum = 0;
    for (int64_t id : tokens) sum += id;
    return static_cast<double>(sum % 5) / 4.0;
  });
}

// Steps [from, to) of `t`, each on groups sampled from its policy with
// sampling seed `seed` + step.
void TrainOnPolicy(Trainer& t, const ExperimentConfig& e, int from, int to, uint64_t seed) {
  for (int step = from; step < to; ++step) {
    TrainStepRequest req;
    req.set_step(step);
    *req.mutable_groups() = Rollout(Policy(t), e, seed + step);
    REQUIRE(t.TrainStep(req).ok());
  }
}

// The response tokens' log-probs under `model` as [B, T] (one row per
// sample, right-padded) with their mask.
std::pair<at::Tensor, at::Tensor> ResponseLogProbs(actor::Transformer& model, const GroupList& groups) {
  std::vector<std::vector<int64_t>> rows;
  std::vector<std::pair<int64_t, int64_t>> spans;  // first target position, count
  int64_t L = 0;
  for (const auto& g : groups.groups()) {
    for (const auto& s : g.samples()) {
      std::vector<int64_t> ids(s.prompt_token_ids().begin(), s.prompt_token_ids().end());
      ids.insert(ids.end(), s.response_token_ids().begin(), s.response_token_ids().end());
      spans.emplace_back(s.prompt_token_ids_size() - 1, s.response_token_ids_size());
      L = std::max<int64_t>(L, static_cast<int64_t>(ids.size()));
      rows.push_back(std::move(ids));
    }
  }
  const int64_t B = static_cast<int64_t>(rows.size());
  at::Tensor ids = torch::zeros({B, L}, torch::kLong);
  at::Tensor mask = torch::zeros({B, L - 1}, torch::kFloat);
  for (int64_t b = 0; b < B; ++b) {
    for (size_t j = 0; j < rows[b].size(); ++j) ids[b][j] = rows[b][j];
    mask.narrow(0, b, 1).narrow(1, spans[b].first, spans[b].second).fill_(1.0);
  }
  at::Tensor pos = torch::arange(L, torch::kLong).unsqueeze(0).expand({B, L});
  at::Tensor logits = model->Forward(ids, pos).narrow(1, 0, L - 1);
  at::Tensor logp = torch::log_softmax(logits.to(torch::kFloat), -1).gather(-1, ids.narrow(1, 1, L - 1).unsqueeze(-1));
  return {logp.squeeze(-1), mask};
}

// One GRPO step of `model`'s adapters on `groups` as the stage configures it
// (token-mean PPO-clip loss, k3 KL to the base with the adapters off, clip
// to norm 1), with LibTorch's AdamW.
void ReferenceStep(actor::Transformer& model, torch::optim::AdamW& opt, const GroupList& groups, double kl_coef) {
  opt.zero_grad();
  at::Tensor ref_logp;
  {
    torch::NoGradGuard no_grad;
    actor::AdaptersOff off(model);
    ref_logp = ResponseLogProbs(model, groups).first;
  }
  auto [logp, mask] = ResponseLogProbs(model, groups);
  const int64_t G = groups.groups_size(), n = groups.groups(0).samples_size();
  at::Tensor rewards = torch::zeros({G, n}, torch::kFloat);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t i = 0; i < n; ++i) rewards[g][i] = groups.groups(g).samples(i).reward();
  }
  auto adv = GrpoAdvantages(rewards);
  REQUIRE(adv.ok());
  PolicyLossInputs in;
  in.logp = logp;
  in.old_logp = logp.detach();
  in.advantages = adv->reshape({G * n, 1}).expand_as(logp).contiguous();
  in.mask = mask;
  in.ref_logp = ref_logp;
  PolicyLossOptions o;
  o.kl_coef = kl_coef;
  auto loss = PolicyLoss(in, o);
  REQUIRE(loss.ok());
  loss->loss.backward();
  std::vector<at::Tensor> params;
  for (auto& [name, t] : model->AdapterParameters()) params.push_back(t);
  torch::nn::utils::clip_grad_norm_(params, 1.0);
  opt.step();
}

TEST_CASE("LoRA GRPO: two steps equal LibTorch's AdamW on a model built here; the base stays bit for bit over 10") {
  actor::ConfigureThreads(2);
  const double kl = 0.05;
  ExperimentConfig e = LoraGrpo(10, kl);
  Trainer t;
  REQUIRE(t.Configure(Request(e)).ok());
  const Named base = Clone(t.PolicyParameters());
  const Named adapters0 = Clone(Policy(t)->AdapterParameters());
  // 2 layers x 7 projections, lora_A and lora_B each.
  REQUIRE(adapters0.size() == 28);
  for (const auto& [name, p] : Policy(t)->NamedParameters()) CHECK_FALSE(p.requires_grad());

  // The reference: the same base and adapters in a model of its own.
  actor::ModelConfig cfg = Policy(t)->config();
  actor::Transformer ref(cfg);
  {
    torch::NoGradGuard no_grad;
    auto dst = ref->NamedParameters();
    for (size_t i = 0; i < dst.size(); ++i) dst[i].second.copy_(base[i].second);
  }
  REQUIRE(actor::SetAdapters(ref, adapters0, 8.0 / 4.0).ok());
  std::vector<at::Tensor> params;
  for (auto& [name, p] : ref->AdapterParameters()) {
    p.set_requires_grad(true);
    params.push_back(p);
  }
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(0.02).betas({0.9, 0.999}).eps(1e-4).weight_decay(0));

  for (int step = 0; step < 2; ++step) {
    GroupList groups = Rollout(Policy(t), e, 100 + step);
    TrainStepRequest req;
    req.set_step(step);
    *req.mutable_groups() = groups;
    auto r = t.TrainStep(req);
    REQUIRE(r.ok());
    ReferenceStep(ref, opt, groups, kl);
    const double d = MaxDiff(Policy(t)->AdapterParameters(), ref->AdapterParameters());
    INFO("step " << step << " max |adapter - reference| " << d);
    CHECK(d <= 1e-5);
    // The adapters moved (the comparison is not between two copies of the
    // start).
    CHECK(MaxDiff(Policy(t)->AdapterParameters(), adapters0) > 1e-4);
    if (step == 1) CHECK(r->metrics().values().at("kl") > 0.0);
  }
  TrainOnPolicy(t, e, 2, 10, 100);
  const Named after = t.PolicyParameters();
  REQUIRE(after.size() == base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    INFO(base[i].first);
    CHECK(torch::equal(after[i].second, base[i].second));
  }
}

TEST_CASE("LoRA: the KL reference is the base (no second model); the sync sends adapters with B scaled") {
  actor::ConfigureThreads(2);
  ExperimentConfig e = LoraGrpo(3, 0.1);
  Trainer t;
  REQUIRE(t.Configure(Request(e)).ok());
  TrainOnPolicy(t, e, 0, 3, 200);
  auto sync = t.SyncTensors();
  REQUIRE(sync.ok());
  const Named adapters = Policy(t)->AdapterParameters();
  REQUIRE(sync->size() == adapters.size());
  int64_t synced = 0, whole = 0;
  for (size_t i = 0; i < adapters.size(); ++i) {
    const auto& [name, t_sync] = (*sync)[i];
    CHECK(name == adapters[i].first);
    const bool is_b = name.find("lora_B") != std::string::npos;
    CHECK(torch::allclose(t_sync, is_b ? adapters[i].second * 2.0 : adapters[i].second));
    synced += t_sync.numel();
  }
  for (const auto& [name, p] : t.PolicyParameters()) whole += p.numel();
  INFO("synced " << synced << " of " << whole);
  CHECK(synced * 5 < whole);
  // A rollout model that receives the base once and then only the synced
  // adapters (scaling 1) computes what the learner's policy computes.
  actor::Transformer worker(Policy(t)->config());
  {
    torch::NoGradGuard no_grad;
    auto dst = worker->NamedParameters();
    auto src = t.PolicyParameters();
    for (size_t i = 0; i < dst.size(); ++i) dst[i].second.copy_(src[i].second);
  }
  REQUIRE(actor::SetAdapters(worker, *sync, 1.0).ok());
  at::Tensor ids = torch::tensor({{3, 5, 7, 9, 11}}, torch::kLong);
  at::Tensor pos = torch::arange(5, torch::kLong).unsqueeze(0);
  torch::NoGradGuard no_grad;
  at::Tensor want = Policy(t)->Forward(ids, pos);
  CHECK((worker->Forward(ids, pos) - want).abs().max().item<double>() < 1e-6);
  // With the adapters off the policy is the base, which the step did not
  // touch: the adapters changed the outputs.
  actor::AdaptersOff off(Policy(t));
  CHECK((Policy(t)->Forward(ids, pos) - want).abs().max().item<double>() > 1e-5);
}

TEST_CASE("LoRA SFT learns through the adapters alone; its checkpoint is PEFT's and resumes bit for bit") {
  actor::ConfigureThreads(2);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = testing::TinyExperiment(7, 8);
  e.mutable_model()->mutable_lora()->set_rank(8);
  e.mutable_model()->mutable_lora()->set_alpha(16);
  Stage s;
  s.mutable_sft()->set_steps(200);
  s.mutable_sft()->set_batch(8);
  s.mutable_sft()->mutable_optimizer()->set_lr(3e-2);
  *e.add_stages() = s;
  Trainer t;
  REQUIRE(t.Configure(Request(e, dir.path())).ok());
  const Named base = Clone(t.PolicyParameters());
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    TrainStepRequest req;
    req.set_step(step);
    req.set_from_task(true);
    auto r = t.TrainStep(req);
    REQUIRE(r.ok());
    if (step == 0) first = r->metrics().values().at("loss");
    last = r->metrics().values().at("loss");
  }
  // From a random base whose lm_head, embeddings and norms stay frozen the
  // logits cannot grow much (the final RMSNorm bounds the hidden state and
  // the head is N(0, 0.02)): the loss falls from ln(V) but not far (about
  // 4.55 -> 4.2). Frozen adapters would leave it at ln(V) on every batch.
  INFO("loss " << first << " -> " << last);
  CHECK(last < first - 0.2);
  for (size_t i = 0; i < base.size(); ++i) CHECK(torch::equal(t.PolicyParameters()[i].second, base[i].second));

  auto saved = t.Save();
  REQUIRE(saved.ok());
  CHECK(std::filesystem::exists(saved->path() + "/adapter_config.json"));
  CHECK(std::filesystem::exists(saved->path() + "/adapter_model.safetensors"));
  // The folder loads as the trained policy: base + adapter.
  auto loaded = actor::LoadHfModel(saved->path());
  REQUIRE(loaded.ok());
  at::Tensor ids = torch::tensor({{3, 5, 7, 9, 11}}, torch::kLong);
  at::Tensor pos = torch::arange(5, torch::kLong).unsqueeze(0);
  {
    torch::NoGradGuard no_grad;
    CHECK(torch::equal((*loaded)->Forward(ids, pos), Policy(t)->Forward(ids, pos)));
  }
  // Resume: the next steps of a fresh trainer from the checkpoint equal the
  // next steps of this one.
  Trainer u;
  REQUIRE(u.Configure(Request(e, dir.path())).ok());
  REQUIRE(u.step() == 100);
  for (int step = 100; step < 104; ++step) {
    TrainStepRequest req;
    req.set_step(step);
    req.set_from_task(true);
    REQUIRE(t.TrainStep(req).ok());
    REQUIRE(u.TrainStep(req).ok());
  }
  const Named at = Policy(t)->AdapterParameters(), au = Policy(u)->AdapterParameters();
  REQUIRE(at.size() == au.size());
  for (size_t i = 0; i < at.size(); ++i) CHECK(torch::equal(at[i].second, au[i].second));
}

TEST_CASE("LoRA: a stage that starts from a LoRA checkpoint merges its adapter and trains fresh ones") {
  actor::ConfigureThreads(2);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = LoraGrpo(2, 0.1);
  Trainer t;
  REQUIRE(t.Configure(Request(e)).ok());
  TrainOnPolicy(t, e, 0, 2, 300);
  auto saved = t.Save(dir.path() + "/stage0");
  REQUIRE(saved.ok());
  at::Tensor ids = torch::tensor({{3, 5, 7, 9, 11}}, torch::kLong);
  at::Tensor pos = torch::arange(5, torch::kLong).unsqueeze(0);
  torch::NoGradGuard no_grad;
  const at::Tensor trained = Policy(t)->Forward(ids, pos);

  ConfigureRequest next = Request(e);
  next.set_init_checkpoint(saved->path());
  Trainer u;
  REQUIRE(u.Configure(next).ok());
  // Fresh adapters (B = 0) on the merged base: the policy, and the base the
  // KL measures against, are the trained policy of the stage before.
  CHECK((Policy(u)->Forward(ids, pos) - trained).abs().max().item<double>() < 1e-5);
  actor::AdaptersOff off(Policy(u));
  CHECK((Policy(u)->Forward(ids, pos) - trained).abs().max().item<double>() < 1e-5);
}

TEST_CASE("LoRA under data parallelism: K=2 (plain and ZeRO-1) equals K=1; every rank holds the same adapters") {
  actor::ConfigureThreads(1);
  ExperimentConfig e = LoraGrpo(3, 0.1);
  Trainer single;
  REQUIRE(single.Configure(Request(e)).ok());
  std::vector<GroupList> batches;
  for (int step = 0; step < 3; ++step) {
    batches.push_back(Rollout(Policy(single), e, 400 + step));
    TrainStepRequest req;
    req.set_step(step);
    *req.mutable_groups() = batches.back();
    REQUIRE(single.TrainStep(req).ok());
  }
  for (int zero : {0, 1}) {
    INFO("learner.zero " << zero);
    rlmesh::testing::TempDir dir;
    ExperimentConfig e2 = e;
    e2.mutable_learner()->set_zero(zero);
    Trainer ranks[2];
    auto results = testing::TrainShards(ranks, 2, Request(e2), dir.File("store"), 3, [&](int step) {
      TrainStepRequest req;
      req.set_step(step);
      *req.mutable_groups() = batches[step];
      return req;
    });
    REQUIRE(results[0].ok());
    REQUIRE(results[1].ok());
    CHECK(MaxDiff(Policy(ranks[0])->AdapterParameters(), Policy(single)->AdapterParameters()) <= 1e-5);
    CHECK(MaxDiff(Policy(ranks[0])->AdapterParameters(), Policy(ranks[1])->AdapterParameters()) == 0.0);
  }
}

TEST_CASE("LoRA: model.lora.path merges a PEFT adapter into the base before the first stage") {
  actor::ConfigureThreads(2);
  rlmesh::testing::TempDir dir;
  ExperimentConfig e = LoraGrpo(2, 0.0);
  Trainer t;
  REQUIRE(t.Configure(Request(e)).ok());
  TrainOnPolicy(t, e, 0, 2, 500);
  // Its adapter alone, as PEFT lays one out (no base weights beside it).
  const std::string adapter = dir.File("adapter");
  std::filesystem::create_directories(adapter);
  actor::LoraSpec spec;
  spec.rank = 4;
  spec.alpha = 8;
  spec.targets = actor::LoraTargetNames();
  REQUIRE(actor::SaveAdapter(Policy(t), spec, adapter).ok());
  REQUIRE(!std::filesystem::exists(adapter + "/model.safetensors"));

  // The same seed builds the same scratch base; with the adapter merged in
  // it is the trained policy.
  ExperimentConfig e2 = e;
  e2.mutable_model()->mutable_lora()->set_path(adapter);
  Trainer u;
  REQUIRE(u.Configure(Request(e2)).ok());
  at::Tensor ids = torch::tensor({{3, 5, 7, 9, 11}}, torch::kLong);
  at::Tensor pos = torch::arange(5, torch::kLong).unsqueeze(0);
  torch::NoGradGuard no_grad;
  const at::Tensor want = Policy(t)->Forward(ids, pos);
  CHECK((Policy(u)->Forward(ids, pos) - want).abs().max().item<double>() < 1e-5);
  // And without it, the untrained base.
  Trainer plain;
  REQUIRE(plain.Configure(Request(e)).ok());
  CHECK((Policy(plain)->Forward(ids, pos) - want).abs().max().item<double>() > 1e-5);

  ExperimentConfig bad = e;
  bad.mutable_model()->mutable_lora()->set_path(dir.File("missing"));
  Trainer v;
  auto refused = v.Configure(Request(bad));
  CHECK_FALSE(refused.ok());
  CHECK(absl::StrContains(refused.status().message(), "model.lora.path"));
}

}  // namespace
}  // namespace rlmesh::learner
