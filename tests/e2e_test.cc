// End to end across real processes: `coordinator run` on a short SFT -> GRPO
// experiment must finish, write its metrics, and learn: held-out accuracy
// after training is far above the untrained model's, and GRPO does not undo
// the SFT policy. A second case cancels a run with SIGINT mid-stage and
// checks the clean stop; another runs asynchronous GRPO on two learner shards.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "catch2/catch.hpp"
#include "common/rpc_client.h"
#include "common/subprocess.h"
#include "proto/coordinator.grpc.pb.h"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"
#include "tests/run_util.h"

namespace rlmesh {
namespace {

using testing::LastStep;
using testing::ReadAll;
using testing::RunDir;

TEST_CASE("SFT then GRPO across real processes learns the task") {
  testing::TempDir dir;
  auto run = Subprocess::Start({testing::Runfile("coordinator/coordinator"), "run",
                                testing::Runfile("configs/grpo_arith_e2e.yaml"), "--run_dir=" + dir.File("runs"),
                                "--bin_dir=" + testing::Runfile("")},
                               dir.File("out"));
  REQUIRE(run.ok());
  auto st = run->Wait(absl::Minutes(12));
  const std::string out = ReadAll(dir.File("out"));
  INFO(out);
  REQUIRE(st.ok());
  REQUIRE(*st == 0);
  CHECK(out.find("done: held-out accuracy") != std::string::npos);

  const std::string run_dir = RunDir(dir.File("runs"));
  REQUIRE(!run_dir.empty());
  std::map<std::string, double> final_acc;
  // The last eval of each stage (the stage's final one).
  std::map<std::string, nlohmann::json> final_eval;
  int grpo_steps = 0, until_checks = 0;
  std::vector<double> train_reward;  // per GRPO step: mean reward of its 256 samples
  std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
  std::string line;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "eval") {
      final_acc[j["stage"].get<std::string>()] = j["accuracy"].get<double>();
      final_eval[j["stage"].get<std::string>()] = j;
    }
    // The SFT stop rule's checks (greedy only) ride on the step lines.
    if (j["event"] == "step" && j["stage"] == "sft" && j.contains("accuracy")) ++until_checks;
    if (j["event"] == "step" && j["stage"] == "sft" && j.contains("until_reached")) CHECK(j["accuracy"] >= 0.4);
    if (j["event"] == "step" && j["stage"] == "grpo") {
      ++grpo_steps;
      CHECK(j.contains("rollout_reward_mean"));
      if (j.contains("rollout_reward_mean")) train_reward.push_back(j["rollout_reward_mean"].get<double>());
      CHECK(j.contains("seconds_generate"));
      CHECK(j.contains("seconds_sync"));
    }
  }
  CHECK(grpo_steps == 20);
  CHECK(until_checks >= 1);
  // eval.pass_at [1, 4]: every stage's final eval samples pass@k next to
  // greedy accuracy.
  for (const auto& [stage, j] : final_eval) {
    INFO("stage " << stage);
    REQUIRE(j.contains("pass@1"));
    REQUIRE(j.contains("pass@4"));
    CHECK(j["pass@1"].get<double>() >= 0.0);
    CHECK(j["pass@4"].get<double>() >= j["pass@1"].get<double>());
    CHECK(j["pass@4"].get<double>() <= 1.0);
  }
  REQUIRE(final_acc.count("init"));
  REQUIRE(final_acc.count("sft"));
  REQUIRE(final_acc.count("grpo"));
  INFO("init " << final_acc["init"] << " sft " << final_acc["sft"] << " grpo " << final_acc["grpo"]);
  // SFT stops at its first check >= 40%. Over 20 GRPO steps the held-out
  // greedy answer moves by less than the 300-prompt eval's noise on some
  // CPUs: on one 2-core VM greedy gained +2.7 to +14.0 points over
  // seeds 1-5 and 1234; on a 2-core AMD EPYC VM seeds 1, 2, 3, 1234 gained
  // +1.7, +3.7, +4.7, -3.3 greedy, and even sampled pass@1 rose +2.75 with
  // learning broken (eval sampling noise). What GRPO optimises, the reward
  // of its own samples (256 per step), separates the two: the mean of the
  // last 5 steps minus the first 5 was +4.4, +8.5, +7.0 points for seeds 1,
  // 2, 3 and -1.0 with the GRPO learning rate at 1e-12 (learning broken).
  // So the learning check is on that, and greedy accuracy must not collapse.
  CHECK(final_acc["sft"] >= 0.4);
  CHECK(final_acc["grpo"] >= final_acc["init"] + 0.3);
  CHECK(final_acc["grpo"] >= final_acc["sft"] - 0.10);
  REQUIRE(train_reward.size() == 20);
  double first = 0, last = 0;
  for (int k = 0; k < 5; ++k) {
    first += train_reward[k] / 5;
    last += train_reward[15 + k] / 5;
  }
  INFO("training reward, mean of the first 5 steps " << first << ", of the last 5 " << last);
  CHECK(last >= first + 0.02);
  // TensorBoard event files were written.
  bool events = false;
  for (const auto& e : std::filesystem::directory_iterator(run_dir + "/tensorboard")) {
    events = events || e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  CHECK(events);
}

TEST_CASE("asynchronous GRPO (rollout one version ahead) on K=2 learner shards, Gloo weight sync, learns") {
  testing::TempDir dir;
  auto run = Subprocess::Start({testing::Runfile("coordinator/coordinator"), "run",
                                testing::Runfile("configs/grpo_arith_e2e.yaml"), "--run_dir=" + dir.File("runs"),
                                "--bin_dir=" + testing::Runfile(""), "--set=learner.shards=2",
                                "--set=stages[1].grpo.rl.max_staleness=1",
                                // Weights go through a Gloo group on the c10d store learner 0 hosts.
                                "--set=weight_sync.backend=gloo", "--set=logging.tensorboard=false"},
                               dir.File("out"));
  REQUIRE(run.ok());
  auto st = run->Wait(absl::Minutes(12));
  const std::string out = ReadAll(dir.File("out"));
  INFO(out);
  REQUIRE(st.ok());
  REQUIRE(*st == 0);
  CHECK(out.find("c10d store (learner 0) on 127.0.0.1:") != std::string::npos);
  CHECK(out.find("syncing through checkpoint folders") == std::string::npos);
  const std::string run_dir = RunDir(dir.File("runs"));
  REQUIRE(!run_dir.empty());
  std::map<std::string, double> final_acc;
  int grpo_steps = 0, lagged = 0;
  std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "eval") final_acc[j["stage"].get<std::string>()] = j["accuracy"].get<double>();
    if (j["event"] == "step" && j["stage"] == "grpo") {
      ++grpo_steps;
      // Never staler than the bound; after the first step the rollout does
      // run ahead (its groups come from the previous version).
      REQUIRE(j.contains("rollout_lag_versions"));
      CHECK(j["rollout_lag_versions"].get<double>() <= 1.0);
      if (j["rollout_lag_versions"].get<double>() == 1.0) ++lagged;
    }
  }
  CHECK(grpo_steps == 20);
  CHECK(lagged >= 15);
  INFO("sft " << final_acc["sft"] << " grpo " << final_acc["grpo"]);
  // What held for every seed tried (1-5 and 1234, one run each: async runs
  // are not deterministic): SFT reached 40.7-47.0%, and after 20 async steps
  // accuracy was 32.3-54.7%, from -10.3 to +9.0 points against the base. So
  // this case checks the machinery (the lag bound, the Gloo group, a run
  // that ends with a working policy), not a gain: 20 staleness-1 steps on
  // two shards do not reliably improve this policy (bench/learning.md).
  CHECK(final_acc["sft"] >= 0.4);
  CHECK(final_acc["grpo"] >= 0.2);
}

// rollout.dtype: bf16 with fp32 master weights: each sync carries half the
// bytes of the fp32 checkpoint, the workers say they hold bf16, and every
// step logs the rollout/learner log-prob gap (exactly 0 when both are fp32,
// about 0.01 here in bf16), which the default truncated IS corrects.
TEST_CASE("bf16 rollout: the sync sends bf16 cast from the fp32 masters, and the log-prob gap is logged") {
  testing::TempDir dir;
  auto run = Subprocess::Start({testing::Runfile("coordinator/coordinator"), "run",
                                testing::Runfile("configs/grpo_arith_e2e.yaml"), "--run_dir=" + dir.File("runs"),
                                "--bin_dir=" + testing::Runfile(""), "--set=rollout.dtype=bf16",
                                "--set=stages[1].grpo.rl.steps=5", "--set=logging.tensorboard=false"},
                               dir.File("out"));
  REQUIRE(run.ok());
  auto st = run->Wait(absl::Minutes(10));
  const std::string out = ReadAll(dir.File("out"));
  INFO(out);
  REQUIRE(st.ok());
  REQUIRE(*st == 0);
  const std::string run_dir = RunDir(dir.File("runs"));
  REQUIRE(!run_dir.empty());
  int grpo_steps = 0;
  std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] != "step" || j["stage"] != "grpo") continue;
    ++grpo_steps;
    INFO(line);
    CHECK(j["weight_sync"] == "shm");
    CHECK(j["mismatch_abs_diff"].get<double>() > 1e-3);
    CHECK(j["mismatch_abs_diff"].get<double>() < 0.2);
  }
  CHECK(grpo_steps == 5);
  // The fp32 checkpoint the SFT stage ended with, against what each sync
  // carried (the file adds only its JSON header).
  int64_t fp32_bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(run_dir + "/checkpoints/0-sft")) {
    if (e.path().filename() == "model.safetensors") fp32_bytes = static_cast<int64_t>(e.file_size());
  }
  REQUIRE(fp32_bytes > 0);
  std::istringstream log(ReadAll(run_dir + "/logs/rollout-0.log"));
  int syncs = 0;
  for (std::string line; std::getline(log, line);) {
    const size_t at = line.find("received weights version=");
    if (at == std::string::npos) continue;
    ++syncs;
    INFO(line);
    CHECK(line.find(" dtype=bf16 ") != std::string::npos);
    const int64_t bytes = std::stoll(line.substr(line.find(" bytes=") + 7));
    CHECK(2 * bytes <= fp32_bytes);
    CHECK(2 * bytes >= fp32_bytes - 65536);
  }
  CHECK(syncs >= 5);  // every SFT and GRPO step syncs the workers
}

TEST_CASE("weight sync in pieces: learner tp=2 to rollout tp=2, Gloo and shared memory, the rollout's weights are "
          "the learner's") {
  // GRPO from a scratch model, no SFT: what is checked is that each step's
  // rollout sampled from exactly the weights the learner trains (the
  // learner recomputes the rollout's log-probs), so every piece reached the
  // rank it belongs to, at every sync.
  testing::TempDir dir;
  {
    std::ofstream f(dir.File("pieces.yaml"));
    f << "name: pieces_e2e\nseed: 7\n"
         "model: {init: scratch, arch: llama, hidden: 64, layers: 2, heads: 4, kv_heads: 2, max_positions: 32, "
         "tokenizer: char}\n"
         "task: {kind: arithmetic, digits: 2, ops: \"+\", train: 200, eval: 20}\n"
         "stages:\n  - grpo:\n      rl: {steps: 3, prompts_per_step: 8, samples_per_prompt: 4, "
         "optimizer: {lr: 1.0e-2}}\n"
         "rollout: {workers: 2, tp: 2, sampling: {temperature: 1.0, max_new_tokens: 5}}\n"
         "reward: {verifiers: [{name: numeric_answer, weight: 1.0}]}\n"
         "learner: {shards: 2, tp: 2}\n"
         "checkpoint: {every: 0}\neval: {every: 0}\nlogging: {tensorboard: false}\n";
  }
  for (const std::string backend : {"gloo", "shm"}) {
    INFO("backend " << backend);
    const std::string runs = dir.File("runs-" + backend);
    auto st = testing::RunExperiment(dir.File("pieces.yaml"), runs, {"--set=weight_sync.backend=" + backend},
                                     dir.File("out-" + backend), absl::Minutes(6));
    const std::string out = ReadAll(dir.File("out-" + backend));
    INFO(out);
    REQUIRE(st.ok());
    REQUIRE(*st == 0);
    CHECK(out.find("weight sync in 2 pieces (learner.tp=2, rollout.tp=2)") != std::string::npos);
    CHECK(out.find("syncing through checkpoint folders") == std::string::npos);
    const std::string run_dir = RunDir(runs);
    REQUIRE(!run_dir.empty());
    int steps = 0;
    std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["event"] != "step") continue;
      ++steps;
      REQUIRE(j.contains("behaviour_logp_abs_diff_max"));
      // The same weights on both sides, up to TP's summation order.
      CHECK(j["behaviour_logp_abs_diff_max"].get<double>() <= 1e-4);
    }
    CHECK(steps == 3);
  }
}

TEST_CASE("DPO then PPO under learner.zero: 3, learner.tp: 2 and both (tp=2 x dp=2) across real processes; the "
          "logged steps merge the learner ranks") {
  // Two learner processes (four for tp=2 x dp=2 x ZeRO-3), tiny scratch
  // model, a few steps of each stage: the layouts run both stages end to
  // end (DPO's policy reaches the PPO stage's rollout: the learner
  // recomputes the rollout's log-probs), and the logged step counts every
  // replica's pairs once (8 = 4 + 4 under ZeRO-3, where each rank trains
  // half; 8 under tp=2, one replica; 8 = 4 + 4 over two replicas of two TP
  // ranks). All send the weights in pieces, each learner rank its slice.
  testing::TempDir dir;
  {
    std::ofstream f(dir.File("layouts.yaml"));
    f << "name: layouts_e2e\nseed: 7\n"
         "model: {init: scratch, arch: llama, hidden: 64, layers: 2, heads: 4, kv_heads: 2, max_positions: 32, "
         "tokenizer: char}\n"
         "task: {kind: arithmetic, digits: 2, ops: \"+\", train: 200, eval: 20}\n"
         "stages:\n"
         "  - dpo: {steps: 3, batch: 8, beta: 0.1, optimizer: {lr: 1.0e-3}}\n"
         "  - ppo:\n      rl: {steps: 3, prompts_per_step: 8, samples_per_prompt: 1, optimizer: {lr: 1.0e-3}}\n"
         "rollout: {workers: 1, sampling: {temperature: 1.0, max_new_tokens: 5}}\n"
         "reward: {verifiers: [{name: numeric_answer, weight: 1.0}]}\n"
         "learner: {shards: 2}\n"
         "checkpoint: {every: 0}\neval: {every: 0}\nlogging: {tensorboard: false}\n";
  }
  struct Layout {
    std::string name;
    std::vector<std::string> sets;
    std::string pieces;  // the coordinator's line on the weight sync
  };
  const std::vector<Layout> layouts = {
      {"zero", {"--set=learner.zero=3"}, "weight sync in 2 pieces (learner.zero=3 over 2 ranks, rollout.tp=1)"},
      {"tp", {"--set=learner.tp=2"}, "weight sync in 2 pieces (learner.tp=2, rollout.tp=1)"},
      {"tp_zero",
       {"--set=learner.shards=4", "--set=learner.tp=2", "--set=learner.zero=3"},
       "weight sync in 4 pieces (learner.zero=3 over 4 ranks, rollout.tp=1)"},
  };
  for (const Layout& layout : layouts) {
    const std::string& name = layout.name;
    INFO("layout " << name);
    const std::string runs = dir.File("runs-" + name);
    auto st = testing::RunExperiment(dir.File("layouts.yaml"), runs, layout.sets, dir.File("out-" + name),
                                     absl::Minutes(6));
    const std::string out = ReadAll(dir.File("out-" + name));
    INFO(out);
    REQUIRE(st.ok());
    REQUIRE(*st == 0);
    // Under every layout the weights reach the rollout in pieces, one from
    // each learner rank.
    CHECK(out.find(layout.pieces) != std::string::npos);
    const std::string run_dir = RunDir(runs);
    REQUIRE(!run_dir.empty());
    int dpo_steps = 0, ppo_steps = 0;
    std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["event"] != "step") continue;
      if (j.contains("pairs")) {
        ++dpo_steps;
        CHECK(j["pairs"].get<double>() == 8.0);
      } else if (j.contains("value_loss")) {
        ++ppo_steps;
        CHECK(j["groups"].get<double>() == 8.0);
        CHECK(j["behaviour_logp_abs_diff_max"].get<double>() <= 1e-4);
      }
    }
    CHECK(dpo_steps == 3);
    CHECK(ppo_steps == 3);
  }
}

TEST_CASE("a run cancelled mid-stage resumes from its checkpoint and finishes") {
  testing::TempDir dir;
  auto first = Subprocess::Start({testing::Runfile("coordinator/coordinator"), "run",
                                  testing::Runfile("configs/grpo_arith_e2e.yaml"), "--run_dir=" + dir.File("runs"),
                                  "--bin_dir=" + testing::Runfile(""), "--set=stages[0].sft.steps=60",
                                  "--set=stages[1].grpo.rl.steps=16", "--set=stages[1].grpo.rl.prompts_per_step=8"},
                                 dir.File("first"));
  REQUIRE(first.ok());
  // Cancel once GRPO is past its first checkpoint (every 5 steps).
  std::string run_dir;
  const absl::Time deadline = absl::Now() + absl::Minutes(8);
  while (absl::Now() < deadline && first->running()) {
    if (run_dir.empty() && std::filesystem::exists(dir.File("runs"))) run_dir = RunDir(dir.File("runs"));
    if (!run_dir.empty() && LastStep(run_dir, "grpo") >= 7) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  INFO(ReadAll(dir.File("first")));
  REQUIRE(!run_dir.empty());
  REQUIRE(first->running());
  first->Signal(SIGINT);
  auto st = first->Wait(absl::Minutes(2));
  REQUIRE(st.ok());
  CHECK(*st != 0);  // cancelled is not success
  const int cancelled_at = LastStep(run_dir, "grpo");
  CHECK(cancelled_at >= 7);
  CHECK(cancelled_at < 16);
  CHECK(ReadAll(dir.File("first")).find("CANCELLED") != std::string::npos);

  auto second = Subprocess::Start({testing::Runfile("coordinator/coordinator"), "run", "--resume=" + run_dir,
                                   "--bin_dir=" + testing::Runfile("")},
                                  dir.File("second"));
  REQUIRE(second.ok());
  st = second->Wait(absl::Minutes(8));
  const std::string out = ReadAll(dir.File("second"));
  INFO(out);
  REQUIRE(st.ok());
  CHECK(*st == 0);
  CHECK(out.find("resume: stage sft already finished") != std::string::npos);
  CHECK(out.find("done: held-out accuracy") != std::string::npos);
  CHECK(LastStep(run_dir, "grpo") == 16);
  // The stage resumed from a checkpoint at or before the cancel, not from 0:
  // its first step after the resume is > 1.
  std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
  std::vector<int> grpo_steps;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "step" && j["stage"] == "grpo") grpo_steps.push_back(j["step"].get<int>());
  }
  REQUIRE(grpo_steps.size() > static_cast<size_t>(cancelled_at));
  const int resumed_from = grpo_steps[cancelled_at];  // first step the second run logged
  CHECK(resumed_from > 1);
  CHECK(resumed_from <= cancelled_at + 1);
}

TEST_CASE("a learner killed with SIGKILL mid-stage is restarted and the run finishes") {
  testing::TempDir dir;
  auto run = Subprocess::Start({testing::Runfile("coordinator/coordinator"), "run",
                                testing::Runfile("configs/grpo_arith_e2e.yaml"), "--run_dir=" + dir.File("runs"),
                                "--bin_dir=" + testing::Runfile(""), "--set=stages[0].sft.steps=60",
                                "--set=stages[1].grpo.rl.steps=12", "--set=stages[1].grpo.rl.prompts_per_step=8"},
                               dir.File("out"));
  REQUIRE(run.ok());
  std::string run_dir;
  const absl::Time deadline = absl::Now() + absl::Minutes(8);
  while (absl::Now() < deadline && run->running()) {
    if (run_dir.empty() && std::filesystem::exists(dir.File("runs"))) run_dir = RunDir(dir.File("runs"));
    if (!run_dir.empty() && LastStep(run_dir, "grpo") >= 6) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  REQUIRE(run->running());
  // The coordinator's address is on its "cluster up" line; its status lists pids.
  const std::string address = testing::CoordinatorAddress(ReadAll(dir.File("out")));
  REQUIRE(!address.empty());
  auto client = RpcClient::Create(address);
  REQUIRE(client.ok());
  auto stub = Coordinator::NewStub(client->channel());
  StatusResponse status;
  auto ctx = client->NewContext(absl::Seconds(10));
  REQUIRE(stub->GetStatus(ctx.get(), StatusRequest(), &status).ok());
  int64_t learner_pid = 0;
  for (const auto& r : status.roles()) {
    if (r.name() == "learner-0") learner_pid = r.pid();
  }
  REQUIRE(learner_pid > 0);
  REQUIRE(::kill(static_cast<pid_t>(learner_pid), SIGKILL) == 0);

  auto st = run->Wait(absl::Minutes(8));
  const std::string all = ReadAll(dir.File("out"));
  INFO(all);
  REQUIRE(st.ok());
  CHECK(*st == 0);
  CHECK(all.find("recover: step") != std::string::npos);
  CHECK(all.find("done: held-out accuracy") != std::string::npos);
  CHECK(LastStep(run_dir, "grpo") == 12);
}

}  // namespace
}  // namespace rlmesh
