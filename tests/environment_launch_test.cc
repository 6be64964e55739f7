// `coordinator run` with environment.launch: the run starts the built-in
// environment server beside the other roles, and its GRPO rollouts are
// multi-turn episodes of the calculator. A short run of the calculator demo
// (configs/grpo_calculator_tiny.yaml) whose SFT data are all tool calls, so
// the base policy calls the tool from the start.
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"
#include "tests/run_util.h"

namespace rlmesh {
namespace {

using testing::ReadAll;
using testing::RunDir;

TEST_CASE("environment.launch: the run starts its environment server and trains on multi-turn episodes") {
  testing::TempDir dir;
  const std::string root = dir.File("runs");
  auto st = testing::RunExperiment(
      testing::Runfile("configs/grpo_calculator_tiny.yaml"), root,
      {"--set=task.sft_tool_calls=1", "--set=stages[0].sft.steps=150", "--set=stages[1].grpo.rl.steps=2",
       "--set=stages[1].grpo.rl.prompts_per_step=8", "--set=eval.prompts=20", "--set=logging.tensorboard=false"},
      dir.File("run.out"), absl::Minutes(8));
  const std::string out = ReadAll(dir.File("run.out"));
  INFO(out);
  REQUIRE(st.ok());
  REQUIRE(*st == 0);
  CHECK(out.find("rlmesh: environment server at 127.0.0.1:") != std::string::npos);
  const std::string run_dir = RunDir(root);
  REQUIRE(!run_dir.empty());
  // The server ran as a role of the run, with its own log.
  CHECK(ReadAll(run_dir + "/logs/environment-0.log").find("evaluator=") != std::string::npos);
  // Every GRPO step trained on episodes with calculator observations in
  // them: response tokens the rollout masked out of the loss.
  int steps = 0;
  std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || j.value("stage", "") != "grpo" || !j.contains("response_masked_frac")) continue;
    ++steps;
    INFO(line);
    CHECK(j["response_masked_frac"].get<double>() > 0.1);
  }
  CHECK(steps == 2);
}

}  // namespace
}  // namespace rlmesh
