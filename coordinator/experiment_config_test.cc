#include "coordinator/experiment_config.h"

#include <fstream>
#include <sstream>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

absl::Status Normalize(const std::string& yaml, ExperimentConfig* cfg) {
  YamlSource src;
  src.file = "e.yaml";
  absl::Status s = MergeYaml(yaml, cfg, &src);
  if (!s.ok()) return s;
  return NormalizeExperiment(cfg, src);
}

TEST_CASE("defaults are filled in") {
  ExperimentConfig cfg;
  REQUIRE(Normalize("name: x\nstages:\n  - grpo: {rl: {steps: 3, prompts_per_step: 4, optimizer: {lr: 1.0e-4}}}\n",
                    &cfg)
              .ok());
  CHECK(cfg.model().hidden() == 256);
  CHECK(cfg.model().kv_heads() == 4);
  CHECK(cfg.model().tokenizer() == "char");
  CHECK(cfg.stages(0).grpo().rl().samples_per_prompt() == 8);
  CHECK(cfg.stages(0).grpo().rl().clip_high() == Approx(0.2));
  CHECK(cfg.reward().verifiers(0).name() == "numeric_answer");
  CHECK(cfg.rollout().sampling().temperature() == Approx(1.0));
  CHECK(cfg.learner().shards() == 1);
}

TEST_CASE("out-of-range values name the key path and line") {
  ExperimentConfig cfg;
  absl::Status s = Normalize("name: x\nstages:\n  - sft:\n      steps: 0\n      batch: 4\n", &cfg);
  CHECK(s.message().find("e.yaml:4: stages[0].sft.steps: must be > 0") != absl::string_view::npos);
  ExperimentConfig c2;
  s = Normalize("name: x\nmodel: {hidden: 30, heads: 4}\nstages: [{sft: {steps: 1, batch: 1, optimizer: {lr: 0.1}}}]\n",
                &c2);
  CHECK(s.message().find("model.heads: must divide model.hidden") != absl::string_view::npos);
  ExperimentConfig c3;
  s = Normalize("name: x\nstages:\n  - grpo: {rl: {steps: 1, prompts_per_step: 1, samples_per_prompt: 1, "
                "optimizer: {lr: 0.001}}}\n",
                &c3);
  CHECK(s.message().find("stages[0].grpo.rl.samples_per_prompt: must be >= 2") != absl::string_view::npos);
  ExperimentConfig c4;
  s = Normalize("stages: [{sft: {steps: 1, batch: 1, optimizer: {lr: 0.001}}}]\n", &c4);
  CHECK(s.message().find("name: required") != absl::string_view::npos);
}

TEST_CASE("the environment section is checked by key") {
  const std::string base = "name: x\nstages: [{sft: {steps: 1, batch: 1, optimizer: {lr: 0.1}}}]\n";
  ExperimentConfig ok;
  CHECK(Normalize(base + "environment: {address: \"127.0.0.1:5\", max_turns: 3, stop_markers: [\"</calc>\"]}\n", &ok)
            .ok());
  ExperimentConfig orphan;
  CHECK(Normalize(base + "environment: {max_turns: 3}\n", &orphan).message().find(
            "environment.max_turns: set without environment.address") != absl::string_view::npos);
  ExperimentConfig no_marker;
  CHECK(Normalize(base + "environment: {address: \"h:1\"}\n", &no_marker).message().find(
            "environment.stop_markers: need at least one") != absl::string_view::npos);
  ExperimentConfig turns;
  CHECK(Normalize(base + "environment: {address: \"h:1\", max_turns: 65, stop_markers: [x]}\n", &turns)
            .message()
            .find("environment.max_turns: must be in [1, 64]") != absl::string_view::npos);
  ExperimentConfig abort;
  CHECK(Normalize(base + "rollout: {on_update: abort}\nenvironment: {address: \"h:1\", stop_markers: [x]}\n", &abort)
            .message()
            .find("multi-turn rollouts need rollout.on_update finish or partial") != absl::string_view::npos);
}

TEST_CASE("every shipped config loads and validates") {
  for (const char* name : {"grpo_arith_tiny", "ppo_arith_tiny", "grpo_arith_e2e", "dpo_arith_tiny", "rm_arith_tiny",
                           "sft_word_problems", "sft_word_problems_qwen3", "grpo_word_problems_qwen3",
                           "grpo_countdown_tiny"}) {
    INFO(name);
    ExperimentConfig cfg;
    YamlSource src;
    REQUIRE(LoadYamlFile(testing::Runfile(std::string("configs/") + name + ".yaml"), &cfg, &src).ok());
    absl::Status s = NormalizeExperiment(&cfg, src);
    INFO(s.ToString());
    CHECK(s.ok());
  }
}

}  // namespace
}  // namespace rlmesh
