#include "common/proto_yaml.h"

#include "catch2/catch.hpp"
#include "proto/config.pb.h"

namespace rlmesh {
namespace {

absl::Status Load(const std::string& yaml, ExperimentConfig* cfg) {
  YamlSource src;
  src.file = "x.yaml";
  return MergeYaml(yaml, cfg, &src);
}

TEST_CASE("a full config loads field by field") {
  ExperimentConfig cfg;
  absl::Status s = Load(R"(
name: grpo_arith
seed: 1234
model: {arch: llama, hidden: 64, layers: 2, heads: 4, kv_heads: 2}
task: {kind: arithmetic, digits: 2}
stages:
  - sft: {steps: 100, batch: 32, optimizer: {lr: 3.0e-3}}
  - grpo:
      advantage: dr_grpo
      rl: {steps: 20, prompts_per_step: 8, samples_per_prompt: 4, clip_low: 0.2, clip_high: 0.28,
           kl: {coef: 0.01, estimator: k3}}
rollout: {workers: 2, sampling: {temperature: 1.0, max_new_tokens: 8, stop_token_ids: [1, 2]}}
reward: {verifiers: [{name: numeric_answer, weight: 1.0}]}
weight_sync: {backend: shm}
)", &cfg);
  REQUIRE(s.ok());
  CHECK(cfg.name() == "grpo_arith");
  CHECK(cfg.seed() == 1234);
  CHECK(cfg.model().kv_heads() == 2);
  REQUIRE(cfg.stages_size() == 2);
  CHECK(cfg.stages(0).sft().optimizer().lr() == Approx(3e-3));
  CHECK(cfg.stages(1).grpo().advantage() == "dr_grpo");
  CHECK(cfg.stages(1).grpo().rl().clip_high() == Approx(0.28));
  CHECK(cfg.stages(1).grpo().rl().kl().estimator() == "k3");
  CHECK(cfg.rollout().sampling().stop_token_ids_size() == 2);
  CHECK(cfg.reward().verifiers(0).name() == "numeric_answer");
  CHECK(cfg.weight_sync().backend() == WEIGHT_SYNC_SHM);
}

TEST_CASE("an unknown key names its path and line") {
  ExperimentConfig cfg;
  absl::Status s = Load("name: x\nstages:\n  - sft:\n      stepz: 3\n", &cfg);
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("x.yaml:4") != absl::string_view::npos);
  CHECK(s.message().find("stages[0].sft.stepz") != absl::string_view::npos);
  CHECK(s.message().find("unknown key") != absl::string_view::npos);
}

TEST_CASE("wrong types and out-of-range integers are errors naming the key") {
  ExperimentConfig cfg;
  absl::Status s = Load("model:\n  hidden: big\n", &cfg);
  CHECK(s.message().find("x.yaml:2: model.hidden: expected an integer") != absl::string_view::npos);
  s = Load("model: {hidden: 99999999999}\n", &cfg);
  CHECK(s.message().find("model.hidden") != absl::string_view::npos);
  s = Load("logging: {tensorboard: maybe}\n", &cfg);
  CHECK(s.message().find("logging.tensorboard: expected true or false") != absl::string_view::npos);
  s = Load("weight_sync: {backend: carrier_pigeon}\n", &cfg);
  CHECK(s.message().find("weight_sync.backend: unknown value 'carrier_pigeon'") != absl::string_view::npos);
  s = Load("model: [1, 2]\n", &cfg);
  CHECK(s.message().find("model: expected a mapping") != absl::string_view::npos);
  s = Load("name: [unclosed\n", &cfg);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("--set overrides a nested key, including inside a list") {
  ExperimentConfig cfg;
  REQUIRE(Load("stages:\n  - sft: {steps: 100}\n", &cfg).ok());
  YamlSource src;
  REQUIRE(ApplyOverride("stages[0].sft.steps=7", &cfg, &src).ok());
  CHECK(cfg.stages(0).sft().steps() == 7);
  REQUIRE(ApplyOverride("model.hidden=32", &cfg, &src).ok());
  CHECK(cfg.model().hidden() == 32);
  REQUIRE(ApplyOverride("rollout.sampling.stop_token_ids=[5, 6]", &cfg, &src).ok());
  CHECK(cfg.rollout().sampling().stop_token_ids(1) == 6);
  CHECK_FALSE(ApplyOverride("stages[3].sft.steps=1", &cfg, &src).ok());
  CHECK(ApplyOverride("model.nope=1", &cfg, &src).message().find("model.nope") != absl::string_view::npos);
  CHECK_FALSE(ApplyOverride("model.nope=1", &cfg, &src).ok());
  CHECK_FALSE(ApplyOverride("novalue", &cfg, &src).ok());
}

}  // namespace
}  // namespace rlmesh
