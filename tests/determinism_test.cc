// Same config, seed, machine and thread counts -> the same run, bit for bit:
// metrics.jsonl (wall-clock fields aside) and the final weights, whatever
// the scheduling of the processes (two rollout workers race to the replay
// buffer; two learner shards race to sample it). And a cancelled run resumed
// from its checkpoint ends with the weights of the uninterrupted run.
// See docs/decisions.md, "Deterministic runs".
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "tests/run_util.h"

namespace rlmesh {
namespace {

using testing::LastStep;
using testing::MetricsWithoutClock;
using testing::ReadAll;
using testing::RunDir;
using testing::StageCheckpoint;

// A short SFT -> RL run: long enough that an order-dependent sum or an
// arrival-ordered batch shows (runs were seen to part after 5 steps).
std::vector<std::string> ShortRun() {
  return {"--set=stages[0].sft.steps=40", "--set=stages[1].grpo.rl.steps=8",
          "--set=stages[1].grpo.rl.prompts_per_step=8", "--set=checkpoint.every=4", "--set=eval.prompts=60",
          "--set=logging.tensorboard=false"};
}

struct Finished {
  std::string run_dir;
  std::vector<std::string> metrics;
  std::string weights;  // the final policy's model.safetensors, bytes
};

Finished RunOnce(const testing::TempDir& dir, const std::string& name, const std::string& config,
                 std::vector<std::string> args) {
  const std::string root = dir.File(name);
  auto st = testing::RunExperiment(testing::Runfile(config), root, args, dir.File(name + ".out"),
                                   absl::Minutes(8));
  INFO(ReadAll(dir.File(name + ".out")));
  REQUIRE(st.ok());
  REQUIRE(*st == 0);
  Finished f;
  f.run_dir = RunDir(root);
  REQUIRE(!f.run_dir.empty());
  f.metrics = MetricsWithoutClock(f.run_dir);
  const std::string ckpt = StageCheckpoint(f.run_dir, 1);
  REQUIRE(!ckpt.empty());
  f.weights = ReadAll(ckpt + "/model.safetensors");
  REQUIRE(f.weights.size() > 1000);
  return f;
}

void ExpectSameRun(const Finished& a, const Finished& b) {
  REQUIRE(a.metrics.size() == b.metrics.size());
  for (size_t i = 0; i < a.metrics.size(); ++i) {
    INFO("metrics.jsonl line " << i + 1);
    CHECK(a.metrics[i] == b.metrics[i]);
  }
  CHECK(a.weights == b.weights);
}

TEST_CASE("GRPO with two rollout workers: two runs are bit-identical") {
  testing::TempDir dir;
  // The config's eval.pass_at [1, 4] samples too: eval sampling is keyed by
  // prompt, not by arrival.
  const auto args = ShortRun();
  const Finished a = RunOnce(dir, "a", "configs/grpo_arith_e2e.yaml", args);
  const Finished b = RunOnce(dir, "b", "configs/grpo_arith_e2e.yaml", args);
  ExpectSameRun(a, b);
  // The runs did train: 8 GRPO steps, each with a nonzero loss line.
  CHECK(LastStep(a.run_dir, "grpo") == 8);
}

TEST_CASE("GRPO on two learner shards: two runs are bit-identical") {
  testing::TempDir dir;
  auto args = ShortRun();
  args.push_back("--set=learner.shards=2");
  const Finished a = RunOnce(dir, "a", "configs/grpo_arith_e2e.yaml", args);
  const Finished b = RunOnce(dir, "b", "configs/grpo_arith_e2e.yaml", args);
  ExpectSameRun(a, b);
}

TEST_CASE("PPO (critic, GAE, whitening): two runs are bit-identical") {
  testing::TempDir dir;
  const std::vector<std::string> args = {"--set=stages[0].sft.steps=40", "--set=stages[1].ppo.rl.steps=6",
                                         "--set=stages[1].ppo.rl.prompts_per_step=16", "--set=eval.prompts=60",
                                         "--set=eval.every=0", "--set=checkpoint.every=0"};
  const Finished a = RunOnce(dir, "a", "configs/ppo_arith_tiny.yaml", args);
  const Finished b = RunOnce(dir, "b", "configs/ppo_arith_tiny.yaml", args);
  ExpectSameRun(a, b);
}

TEST_CASE("cancel after the step-4 checkpoint + resume ends with the uninterrupted run's weights") {
  testing::TempDir dir;
  const Finished whole = RunOnce(dir, "whole", "configs/grpo_arith_e2e.yaml", ShortRun());

  // The same run, cancelled (SIGINT) once GRPO is past its step-4
  // checkpoint but not done, then resumed: it redoes the steps after the
  // checkpoint with the same data and the same rollout streams.
  const std::string root = dir.File("cut");
  std::vector<std::string> argv = {testing::Runfile("coordinator/coordinator"), "run",
                                   testing::Runfile("configs/grpo_arith_e2e.yaml"), "--run_dir=" + root,
                                   "--bin_dir=" + testing::Runfile("")};
  for (const auto& a : ShortRun()) argv.push_back(a);
  auto first = Subprocess::Start(argv, dir.File("cut.out"));
  REQUIRE(first.ok());
  std::string run_dir;
  const absl::Time deadline = absl::Now() + absl::Minutes(6);
  while (absl::Now() < deadline && first->running()) {
    if (run_dir.empty()) run_dir = RunDir(root);
    if (!run_dir.empty() && LastStep(run_dir, "grpo") >= 5) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  INFO(ReadAll(dir.File("cut.out")));
  REQUIRE(!run_dir.empty());
  REQUIRE(first->running());
  first->Signal(SIGINT);
  auto st = first->Wait(absl::Minutes(2));
  REQUIRE(st.ok());
  const int cancelled_at = LastStep(run_dir, "grpo");
  REQUIRE(cancelled_at >= 5);
  REQUIRE(cancelled_at < 8);

  auto second = Subprocess::Start({testing::Runfile("coordinator/coordinator"), "run", "--resume=" + run_dir,
                                   "--bin_dir=" + testing::Runfile("")},
                                  dir.File("resume.out"));
  REQUIRE(second.ok());
  st = second->Wait(absl::Minutes(6));
  INFO(ReadAll(dir.File("resume.out")));
  REQUIRE(st.ok());
  REQUIRE(*st == 0);
  const std::string ckpt = StageCheckpoint(run_dir, 1);
  REQUIRE(!ckpt.empty());
  CHECK(ReadAll(ckpt + "/model.safetensors") == whole.weights);
}

}  // namespace
}  // namespace rlmesh
