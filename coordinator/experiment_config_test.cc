#include "coordinator/experiment_config.h"

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

TEST_CASE("model.lora: defaults, and every layout and stage it does not run with refused by name") {
  const std::string sft = "  - sft: {steps: 1, batch: 1, optimizer: {lr: 0.001}}\n";
  const std::string grpo = "  - grpo: {rl: {steps: 1, prompts_per_step: 1, optimizer: {lr: 0.001}}}\n";
  {
    ExperimentConfig cfg;
    REQUIRE(Normalize("name: x\nmodel: {lora: {rank: 16}}\nstages:\n" + sft + grpo, &cfg).ok());
    CHECK(cfg.model().lora().alpha() == Approx(16));
    CHECK(cfg.model().lora().targets_size() == 7);
    CHECK(cfg.model().lora().init() == "default");
    CHECK(LoraTrains(cfg, cfg.stages(0)));
    CHECK(LoraTrains(cfg, cfg.stages(1)));
  }
  {
    ExperimentConfig cfg;
    REQUIRE(Normalize("name: x\nmodel: {lora: {rank: 8, stages: [grpo], targets: [q_proj, v_proj]}}\nstages:\n" +
                          sft + grpo,
                      &cfg)
                .ok());
    CHECK_FALSE(LoraTrains(cfg, cfg.stages(0)));
    CHECK(LoraTrains(cfg, cfg.stages(1)));
    CHECK(cfg.model().lora().targets_size() == 2);
  }
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"model: {lora: {alpha: 16}}\n", "model.lora.rank: required"},
      {"model: {lora: {rank: 2000}}\n", "model.lora.rank: must be in [1, 1024]"},
      {"model: {lora: {rank: 8, targets: [qkv]}}\n", "model.lora.targets[0]: must be one of"},
      {"model: {lora: {rank: 8, targets: [q_proj, q_proj]}}\n", "model.lora.targets[1]: named twice"},
      {"model: {lora: {rank: 8, init: pissa}}\n", "model.lora.init: must be default or gaussian"},
      {"model: {lora: {rank: 8, stages: [reward_model]}}\n", "model.lora.stages[0]: must be sft, dpo, grpo or ppo"},
      {"model: {lora: {rank: 8, stages: [dpo]}}\n", "model.lora.stages: names no stage"},
      {"model: {lora: {rank: 8, dropout: 0.1}}\n", "model.lora.dropout: must be 0 for RL stages (stages[1])"},
      {"model: {lora: {rank: 8}}\nlearner: {shards: 2, tp: 2}\n", "learner.tp: > 1 with model.lora is not built"},
      {"model: {lora: {rank: 8}}\nlearner: {shards: 2, zero: 3}\n", "learner.zero: 3 with model.lora"},
      {"model: {lora: {rank: 8}}\nrollout: {sleep: weights}\n", "rollout.sleep: weights with model.lora"},
  };
  for (const auto& [yaml, want] : refused) {
    ExperimentConfig cfg;
    INFO(yaml);
    absl::Status s = Normalize("name: x\n" + yaml + "stages:\n" + sft + grpo, &cfg);
    CHECK(s.message().find(want) != absl::string_view::npos);
  }
}

TEST_CASE("model.device takes cpu, cuda and cuda:<index>; anything else is refused by key and line") {
  const std::string stages = "stages: [{sft: {steps: 1, batch: 1, optimizer: {lr: 0.001}}}]\n";
  for (const char* ok : {"cpu", "cuda", "cuda:0", "cuda:7"}) {
    ExperimentConfig cfg;
    INFO(ok);
    CHECK(Normalize(std::string("name: x\nmodel: {device: \"") + ok + "\"}\n" + stages, &cfg).ok());
  }
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:64", "cuda:-1"}) {
    ExperimentConfig cfg;
    INFO(bad);
    absl::Status s = Normalize(std::string("name: x\nmodel:\n  device: \"") + bad + "\"\n" + stages, &cfg);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("e.yaml:3: model.device: must be cpu, cuda or cuda:<index>") != absl::string_view::npos);
    ExperimentConfig r;
    s = Normalize(std::string("name: x\nrollout:\n  device: \"") + bad + "\"\n" + stages, &r);
    CHECK(s.message().find("e.yaml:3: rollout.device: must be cpu, cuda or cuda:<index>") != absl::string_view::npos);
  }
}

TEST_CASE("learner.zero takes 0, 1 and 3; 3 is refused by name where it is not built") {
  const std::string sft = "stages: [{sft: {steps: 1, batch: 2, optimizer: {lr: 0.001}}}]\n";
  for (const char* ok : {"0", "1", "3"}) {
    ExperimentConfig cfg;
    INFO(ok);
    CHECK(Normalize(std::string("name: x\nlearner: {shards: 2, zero: ") + ok + "}\n" + sft, &cfg).ok());
  }
  ExperimentConfig two;
  absl::Status s = Normalize("name: x\nlearner: {zero: 2}\n" + sft, &two);
  CHECK(s.message().find("learner.zero: must be 0, 1 or 3 (ZeRO-2 is not built)") != absl::string_view::npos);
  ExperimentConfig ppo;
  CHECK(Normalize("name: x\nlearner: {zero: 3}\nstages: [{ppo: {rl: {steps: 1, prompts_per_step: 1, optimizer: "
                  "{lr: 0.001}}}}]\n",
                  &ppo)
            .ok());
  ExperimentConfig rm;
  CHECK(Normalize("name: x\nlearner: {zero: 3}\nstages: [{reward_model: {steps: 1, batch: 2, optimizer: {lr: "
                  "0.001}}}]\n",
                  &rm)
            .ok());
  ExperimentConfig dpo;
  CHECK(Normalize("name: x\nlearner: {shards: 2, zero: 3}\nstages: [{dpo: {steps: 1, batch: 2, optimizer: {lr: "
                  "0.001}}}]\n",
                  &dpo)
            .ok());
  ExperimentConfig bf16;
  CHECK(Normalize("name: x\nlearner: {zero: 3, autocast: bf16, gradient_checkpointing: true}\n" + sft, &bf16).ok());
  ExperimentConfig tp_ckpt;
  CHECK(Normalize("name: x\nlearner: {shards: 2, tp: 2, gradient_checkpointing: true}\n" + sft, &tp_ckpt).ok());
  ExperimentConfig gpu;
  s = Normalize("name: x\nmodel: {device: cuda}\nlearner: {zero: 3}\n" + sft, &gpu);
  CHECK(s.message().find("learner.zero: 3 runs on the CPU so far") != absl::string_view::npos);
}

// Each (YAML after "name: x", words of the error) is refused as
// INVALID_ARGUMENT with those words.
void CheckRefused(const std::vector<std::pair<std::string, std::string>>& refused) {
  for (const auto& [yaml, why] : refused) {
    ExperimentConfig cfg;
    INFO(yaml);
    absl::Status s = Normalize("name: x\n" + yaml, &cfg);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(why) != absl::string_view::npos);
  }
}

TEST_CASE("learner.pp divides the shards, defaults its micro-batches and schedule, and is refused by name where "
          "not built") {
  const std::string sft = "stages: [{sft: {steps: 1, batch: 2, optimizer: {lr: 0.001}}}]\n";
  const std::string grpo = "stages: [{grpo: {rl: {steps: 1, prompts_per_step: 1, optimizer: {lr: 0.001}}}}]\n";
  ExperimentConfig ok;
  REQUIRE(Normalize("name: x\nlearner: {shards: 4, pp: 2}\n" + grpo, &ok).ok());
  CHECK(ok.learner().pp() == 2);
  CHECK(ok.learner().pp_microbatches() == 4);
  CHECK(ok.learner().pp_schedule() == "1f1b");
  ExperimentConfig layers;
  REQUIRE(Normalize("name: x\nlearner: {shards: 2, pp: 2, pp_microbatches: 8, pp_layers: [1, 2]}\n" + sft, &layers)
              .ok());
  CHECK(layers.learner().pp_microbatches() == 8);
  CHECK(layers.learner().pp_virtual_stages() == 1);
  ExperimentConfig interleaved;
  REQUIRE(Normalize("name: x\nlearner: {shards: 2, pp: 2, pp_schedule: interleaved, pp_layers: [1, 1, 1, 1]}\n" +
                        grpo,
                    &interleaved)
              .ok());
  CHECK(interleaved.learner().pp_virtual_stages() == 2);
  ExperimentConfig with_tp;
  REQUIRE(Normalize("name: x\nlearner: {shards: 8, pp: 2, tp: 2, zero: 1}\n" + sft, &with_tp).ok());
  ExperimentConfig zero1;
  REQUIRE(Normalize("name: x\nlearner: {shards: 4, pp: 2, zero: 1}\n" + sft, &zero1).ok());
  CHECK(zero1.learner().zero() == 1);
  ExperimentConfig checkpointed;
  REQUIRE(Normalize("name: x\nlearner: {shards: 2, pp: 2, gradient_checkpointing: true}\n" + sft, &checkpointed)
              .ok());
  CHECK(checkpointed.learner().gradient_checkpointing());
  ExperimentConfig pp_dpo;
  REQUIRE(Normalize("name: x\nlearner: {shards: 2, pp: 2}\nstages: [{dpo: {steps: 1, batch: 2, optimizer: {lr: "
                    "0.001}}}]\n",
                    &pp_dpo)
              .ok());
  ExperimentConfig plain;
  REQUIRE(Normalize("name: x\n" + sft, &plain).ok());
  CHECK(plain.learner().pp() == 1);
  CHECK(plain.learner().pp_microbatches() == 0);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"learner: {shards: 3, pp: 2}\n" + sft, "learner.pp: must divide learner.shards (3)"},
      {"learner: {shards: 4, pp: 2, tp: 2, sequence_parallel: true}\n" + sft,
       "learner.sequence_parallel: true with learner.pp > 1 is not built"},
      {"learner: {shards: 6, pp: 2, tp: 2}\n" + sft,
       "learner.pp: must divide learner.shards (6) with learner.tp (4 ranks per replica)"},
      {"learner: {shards: 2, pp: 2, zero: 3}\n" + sft, "learner.zero: 3 with learner.pp > 1 is not built"},
      {"learner: {shards: 2, pp: 2, autocast: bf16}\n" + sft, "learner.autocast: bf16 with learner.pp > 1"},
      {"model: {device: cuda}\nlearner: {shards: 2, pp: 2}\n" + sft, "learner.pp: pipeline parallelism runs on the CPU"},
      {"learner: {shards: 2, pp_schedule: interleaved}\n" + sft,
       "learner.pp_schedule: interleaved needs learner.pp > 1"},
      {"learner: {shards: 2, pp: 2, pp_virtual_stages: 2}\n" + sft,
       "learner.pp_virtual_stages: must be 1 (or 0) under pp_schedule 1f1b"},
      {"learner: {shards: 2, pp: 2, pp_schedule: interleaved, pp_virtual_stages: 1}\n" + sft,
       "learner.pp_virtual_stages: must be in [2, 64] under pp_schedule interleaved"},
      {"learner: {shards: 2, pp: 2, pp_schedule: interleaved, pp_layers: [2, 2]}\n" + sft,
       "learner.pp_layers: has 2 entries for learner.pp = 2 stages x learner.pp_virtual_stages = 2"},
      {"learner: {shards: 2, pp: 2, pp_schedule: gpipe}\n" + sft, "learner.pp_schedule: must be 1f1b or interleaved"},
      {"learner: {shards: 2, pp: 2, pp_layers: [3]}\n" + sft, "learner.pp_layers: has 1 entries for learner.pp = 2"},
      {"learner: {shards: 2, pp: 2, pp_layers: [0, 3]}\n" + sft, "learner.pp_layers[0]: must be >= 1"},
      {"learner: {shards: 2, pp: 2, pp_microbatches: -1}\n" + sft, "learner.pp_microbatches: must be in [0, 4096]"},
      {"model: {lora: {rank: 8}}\nlearner: {shards: 2, pp: 2}\n" + sft, "model.lora: set with learner.pp > 1"},
      {"learner: {shards: 2, pp: 2}\nstages: [{reward_model: {steps: 1, batch: 2, optimizer: {lr: 0.001}}}]\n",
       "stages[0]: learner.pp > 1 is built for sft, grpo and dpo stages (not ppo or reward_model)"},
      {"learner: {shards: 2, pp: 2}\nstages: [{ppo: {rl: {steps: 1, prompts_per_step: 1, optimizer: {lr: "
       "0.001}}}}]\n",
       "stages[0]: learner.pp > 1 is built for sft, grpo and dpo stages"},
  };
  CheckRefused(refused);
}

TEST_CASE("learner.cp divides the shards and is refused by name where not built") {
  const std::string sft = "stages: [{sft: {steps: 1, batch: 2, optimizer: {lr: 0.001}}}]\n";
  const std::string grpo = "stages: [{grpo: {rl: {steps: 1, prompts_per_step: 1, optimizer: {lr: 0.001}}}}]\n";
  ExperimentConfig ok;
  REQUIRE(Normalize("name: x\nlearner: {shards: 4, cp: 2}\n" + grpo, &ok).ok());
  CHECK(ok.learner().cp() == 2);
  ExperimentConfig with_tp;
  REQUIRE(Normalize("name: x\nlearner: {shards: 8, cp: 2, tp: 2}\n" + grpo, &with_tp).ok());
  CHECK(with_tp.learner().tp() == 2);
  ExperimentConfig plain;
  REQUIRE(Normalize("name: x\n" + sft, &plain).ok());
  CHECK(plain.learner().cp() == 1);
  // Packed rows: the ranks mask their attention blocks by segment.
  ExperimentConfig packed;
  REQUIRE(Normalize("name: x\nlearner: {shards: 2, cp: 2}\nstages: [{sft: {steps: 1, batch: 2, packing: true, "
                    "optimizer: {lr: 0.001}}}]\n",
                    &packed)
              .ok());
  CHECK(packed.stages(0).sft().packing());
  ExperimentConfig text;
  REQUIRE(Normalize("name: x\ntask: {kind: text, train_path: c.jsonl}\nlearner: {shards: 2, cp: 2}\n" + sft, &text)
              .ok());
  // ZeRO-1 over the ranks holding the same weights, and checkpointed layers.
  ExperimentConfig zero1_checkpointed;
  REQUIRE(Normalize("name: x\nlearner: {shards: 4, cp: 2, zero: 1, gradient_checkpointing: true}\n" + sft,
                    &zero1_checkpointed)
              .ok());
  CHECK(zero1_checkpointed.learner().zero() == 1);
  CHECK(zero1_checkpointed.learner().gradient_checkpointing());
  ExperimentConfig dpo;
  REQUIRE(Normalize("name: x\nlearner: {shards: 2, cp: 2}\nstages: [{dpo: {steps: 1, batch: 2, optimizer: {lr: "
                    "0.001}}}]\n",
                    &dpo)
              .ok());
  ExperimentConfig distill;
  REQUIRE(Normalize("name: x\nlearner: {shards: 2, cp: 2}\nstages: [{grpo: {rl: {steps: 1, prompts_per_step: 1, "
                    "optimizer: {lr: 0.001}, distillation: {teacher: /t}}}}]\n",
                    &distill)
              .ok());
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"learner: {shards: 3, cp: 2}\n" + sft, "learner.cp: must divide learner.shards (3)"},
      {"learner: {shards: 6, cp: 2, tp: 2}\n" + sft, "learner.cp: must divide learner.shards (6) with learner.tp x learner.pp (4 ranks per replica)"},
      {"learner: {shards: 4, cp: 2, pp: 2}\n" + sft, "learner.pp: > 1 with learner.cp > 1 is not built"},
      {"learner: {shards: 4, cp: 2, tp: 2, sequence_parallel: true}\n" + sft,
       "learner.sequence_parallel: true with learner.cp > 1 is not built"},
      {"learner: {shards: 2, cp: 2, zero: 3}\n" + sft, "learner.zero: 3 with learner.cp > 1 is not built"},
      {"learner: {shards: 2, cp: 2, autocast: bf16}\n" + sft, "learner.autocast: bf16 with learner.cp > 1"},
      {"model: {device: cuda}\nlearner: {shards: 2, cp: 2}\n" + sft, "learner.cp: context parallelism runs on the CPU"},
      {"learner: {shards: 2, cp: 2}\nstages: [{grpo: {advantage: dr_grpo, rl: {steps: 1, prompts_per_step: 1, "
       "optimizer: {lr: 0.001}}}}]\n",
       "stages[0].grpo.rl.loss_agg: must be token-mean with learner.cp > 1"},
      {"learner: {shards: 2, cp: 2}\nstages: [{grpo: {rl: {steps: 1, prompts_per_step: 1, policy_loss: gspo, "
       "optimizer: {lr: 0.001}}}}]\n",
       "stages[0].grpo.rl.loss_agg: must be token-mean"},
      {"learner: {shards: 2, cp: 2}\nstages: [{reward_model: {steps: 1, batch: 2, optimizer: {lr: 0.001}}}]\n",
       "stages[0]: learner.cp > 1 is built for sft, grpo and dpo stages (not ppo or reward_model)"},
  };
  CheckRefused(refused);
}

TEST_CASE("learner.tp divides the shards; it and sequence_parallel are refused by name where not built") {
  const std::string sft = "stages: [{sft: {steps: 1, batch: 2, optimizer: {lr: 0.001}}}]\n";
  ExperimentConfig ok;
  REQUIRE(Normalize("name: x\nlearner: {shards: 4, tp: 2, sequence_parallel: true}\n" + sft, &ok).ok());
  CHECK(ok.learner().tp() == 2);
  ExperimentConfig tp_zero1;
  REQUIRE(Normalize("name: x\nlearner: {shards: 4, tp: 2, zero: 1}\n" + sft, &tp_zero1).ok());
  ExperimentConfig tp_ppo;
  CHECK(Normalize("name: x\nlearner: {shards: 2, tp: 2}\nstages: [{ppo: {rl: {steps: 1, prompts_per_step: 1, "
                  "optimizer: {lr: 0.001}}}}]\n",
                  &tp_ppo)
            .ok());
  ExperimentConfig tp_dpo;
  CHECK(Normalize("name: x\nlearner: {shards: 2, tp: 2}\nstages: [{dpo: {steps: 1, batch: 2, optimizer: {lr: "
                  "0.001}}}]\n",
                  &tp_dpo)
            .ok());
  ExperimentConfig tp_rm;
  CHECK(Normalize("name: x\nlearner: {shards: 2, tp: 2}\nstages: [{reward_model: {steps: 1, batch: 2, optimizer: "
                  "{lr: 0.001}}}]\n",
                  &tp_rm)
            .ok());
  ExperimentConfig plain;
  REQUIRE(Normalize("name: x\n" + sft, &plain).ok());
  CHECK(plain.learner().tp() == 1);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"learner: {shards: 3, tp: 2}\n" + sft, "learner.tp: must divide learner.shards (3)"},
      {"learner: {shards: 2, tp: 4}\n" + sft, "learner.tp: must divide learner.shards (2)"},
      {"learner: {shards: 2, tp: 2, zero: 3, sequence_parallel: true}\n" + sft,
       "learner.sequence_parallel: with learner.zero: 3 is not built"},
      {"learner: {shards: 2, tp: 2, autocast: bf16}\n" + sft, "learner.autocast: bf16 with learner.tp > 1"},
      {"model: {device: cuda}\nlearner: {shards: 2, tp: 2}\n" + sft, "learner.tp: tensor parallelism runs on the CPU"},
      {"learner: {shards: 2, sequence_parallel: true}\n" + sft, "learner.sequence_parallel: needs learner.tp > 1"},
  };
  CheckRefused(refused);
}

TEST_CASE("learner.ep divides the shards, needs a MoE checkpoint and is refused by name where not built") {
  const std::string moe = "model: {init: checkpoint, path: /some/moe}\n";
  const std::string sft = "stages: [{sft: {steps: 1, batch: 2, optimizer: {lr: 0.001}}}]\n";
  ExperimentConfig ok;
  REQUIRE(Normalize("name: x\n" + moe + "learner: {shards: 4, ep: 2}\n" + sft, &ok).ok());
  CHECK(ok.learner().ep() == 2);
  ExperimentConfig plain;
  REQUIRE(Normalize("name: x\n" + sft, &plain).ok());
  CHECK(plain.learner().ep() == 1);
  ExperimentConfig ppo;
  CHECK(Normalize("name: x\n" + moe +
                      "learner: {shards: 2, ep: 2}\nstages: [{ppo: {rl: {steps: 1, prompts_per_step: 2, optimizer: "
                      "{lr: 0.001}}}}]\n",
                  &ppo)
            .ok());
  const std::vector<std::pair<std::string, std::string>> refused = {
      {moe + "learner: {shards: 3, ep: 2}\n" + sft, "learner.ep: must divide learner.shards (3)"},
      {moe + "learner: {shards: 2, ep: 4}\n" + sft, "learner.ep: must divide learner.shards (2)"},
      {"learner: {shards: 2, ep: 2}\n" + sft, "learner.ep: needs a policy with MoE layers; a scratch model"},
      {moe + "learner: {shards: 2, ep: 2, tp: 2}\n" + sft, "learner.ep: expert parallelism with learner.tp > 1"},
      {moe + "learner: {shards: 2, ep: 2, zero: 1}\n" + sft, "learner.zero: 1/3 is not built"},
      {moe + "learner: {shards: 2, ep: 2, autocast: bf16}\n" + sft, "learner.autocast: bf16 with learner.ep > 1"},
      {"model: {init: checkpoint, path: /m, device: cuda}\nlearner: {shards: 2, ep: 2}\n" + sft,
       "learner.ep: expert parallelism runs on the CPU"},
      {moe + "learner: {shards: 2, ep: 2}\nstages: [{reward_model: {steps: 1, batch: 2, optimizer: {lr: 0.001}}}]\n",
       "stages[0]: learner.ep > 1 is built for sft, dpo, grpo and ppo stages"},
  };
  CheckRefused(refused);
}

TEST_CASE("MoE settings: refused by name on a scratch (dense) model, checked on a checkpoint") {
  const std::string stage =
      "stages:\n  - grpo: {rl: {steps: 1, prompts_per_step: 1, optimizer: {lr: 0.001}, ";
  ExperimentConfig c1;
  absl::Status s = Normalize("name: x\n" + stage + "routing_replay: true}}\n", &c1);
  CHECK(s.message().find("stages[0].grpo.rl.routing_replay: needs a policy with MoE layers; a scratch model "
                         "(model.arch llama) has none") != absl::string_view::npos);
  ExperimentConfig c2;
  s = Normalize("name: x\n" + stage + "router_aux_loss_coef: 0.01}}\n", &c2);
  CHECK(s.message().find("stages[0].grpo.rl.router_aux_loss_coef: needs a policy with MoE layers") !=
        absl::string_view::npos);
  // A checkpoint's architecture is the learner's to check; the value is
  // checked here.
  const std::string ckpt = "name: x\nmodel: {init: checkpoint, path: /m}\n";
  ExperimentConfig c3;
  CHECK(Normalize(ckpt + stage + "routing_replay: true, router_aux_loss_coef: 0.01}}\n", &c3).ok());
  CHECK(c3.stages(0).grpo().rl().routing_replay());
  ExperimentConfig c4;
  s = Normalize(ckpt + stage + "router_aux_loss_coef: -1}}\n", &c4);
  CHECK(s.message().find("stages[0].grpo.rl.router_aux_loss_coef: must be >= 0") != absl::string_view::npos);
  ExperimentConfig c5;
  s = Normalize(ckpt + "environment: {address: \"h:1\", stop_markers: [x]}\n" + stage + "routing_replay: true}}\n",
                &c5);
  CHECK(s.message().find("stages[0].grpo.rl.routing_replay: not supported with multi-turn rollouts") !=
        absl::string_view::npos);
}

TEST_CASE("RL algorithm switches: accepted values, and errors that name the key") {
  auto rl = [](const std::string& fields, const std::string& extra = "") {
    ExperimentConfig cfg;
    return Normalize("name: x\nstages:\n  - grpo: {rl: {steps: 1, prompts_per_step: 2, optimizer: {lr: 0.001}, " +
                         fields + "}}\n" + extra,
                     &cfg);
  };
  CHECK(rl("policy_loss: gspo, mismatch: {mode: icepop, level: sequence, low: 0.5, high: 2}").ok());
  CHECK(rl("policy_loss: cispo, overlong_filter: true, dynamic_sampling: {mode: refill, max_rounds: 2}").ok());
  CHECK(rl("importance_cap: 3, mismatch: {mode: tis, level: token}").ok());
  auto has = [](const absl::Status& s, const std::string& text) {
    INFO(s.ToString());
    return s.message().find(text) != absl::string_view::npos;
  };
  CHECK(has(rl("policy_loss: grpo"), "stages[0].grpo.rl.policy_loss: must be ppo, gspo or cispo"));
  CHECK(has(rl("policy_loss: cispo, dual_clip: 3"), "stages[0].grpo.rl.dual_clip: not used by policy_loss cispo"));
  CHECK(has(rl("mismatch: {mode: is}"), "stages[0].grpo.rl.mismatch.mode"));
  CHECK(has(rl("mismatch: {level: row}"), "stages[0].grpo.rl.mismatch.level"));
  CHECK(has(rl("importance_cap: 3, mismatch: {mode: icepop}"), "stages[0].grpo.rl.importance_cap"));
  CHECK(has(rl("importance_cap: 3, mismatch: {high: 4}"), "stages[0].grpo.rl.mismatch.high"));
  CHECK(has(rl("mismatch: {mode: mis, low: 0.5}"), "stages[0].grpo.rl.mismatch.low"));
  CHECK(has(rl("mismatch: {mode: mis, high: 0.5}"), "stages[0].grpo.rl.mismatch.high: must be >= 1"));
  CHECK(has(rl("dynamic_sampling: {mode: resample}"), "stages[0].grpo.rl.dynamic_sampling.mode"));
  CHECK(has(rl("dynamic_sampling: {mode: drop, max_rounds: 2}"), "stages[0].grpo.rl.dynamic_sampling.max_rounds"));
  CHECK(has(rl("dynamic_sampling: {mode: refill}", "buffer: {sample_mode: uniform}\n"),
            "stages[0].grpo.rl.dynamic_sampling.mode: refill needs buffer.sample_mode fifo"));
  // On-policy distillation: one sample per prompt is enough when the
  // teacher's term is the whole advantage, not when the task reward counts.
  CHECK(rl("samples_per_prompt: 1, distillation: {teacher: /t}").ok());
  CHECK(rl("distillation: {teacher: /t, coef: 0.5, task_reward: true}").ok());
  CHECK(has(rl("samples_per_prompt: 1, distillation: {teacher: /t, task_reward: true}"),
            "stages[0].grpo.rl.samples_per_prompt"));
  CHECK(has(rl("distillation: {coef: 1}"), "stages[0].grpo.rl.distillation.teacher: required"));
  CHECK(has(rl("distillation: {teacher: /t, coef: -1}"), "stages[0].grpo.rl.distillation.coef"));
  CHECK(has(rl("distillation: {teacher: /t}, dynamic_sampling: {mode: drop}"), "stages[0].grpo.rl.dynamic_sampling"));
  CHECK(has(rl("distillation: {teacher: /t}, overlong_buffer: 2"), "stages[0].grpo.rl.overlong_buffer"));
  CHECK(has(rl("distillation: {teacher: /t}, kl: {coef: 0.1, in_reward: true}"), "stages[0].grpo.rl.kl.in_reward"));
  ExperimentConfig ppo;
  CHECK(has(Normalize("name: x\nstages:\n  - ppo: {rl: {steps: 1, prompts_per_step: 2, optimizer: {lr: 0.001}, "
                      "distillation: {teacher: /t}}}\n",
                      &ppo),
            "stages[0].ppo.rl.distillation"));
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

TEST_CASE("straggler and reward-call settings are checked by key, with their defaults") {
  const std::string base = "name: x\nstages: [{sft: {steps: 1, batch: 1, optimizer: {lr: 0.1}}}]\n";
  auto message = [&](const std::string& extra) {
    ExperimentConfig cfg;
    return std::string(Normalize(base + extra, &cfg).message());
  };
  ExperimentConfig defaults;
  REQUIRE(Normalize(base, &defaults).ok());
  CHECK(defaults.rollout().request_timeout_ms() == 0);
  CHECK(defaults.reward().call().on_failure() == "retry");
  CHECK(defaults.reward().call().retries() == 2);
  CHECK(defaults.reward().call().breaker_failures() == 5);
  CHECK(defaults.reward().call().breaker_cooldown_ms() == 10000);
  ExperimentConfig set;
  REQUIRE(Normalize(base + "rollout: {request_timeout_ms: 500, on_timeout: drop}\n"
                           "reward: {call: {on_failure: drop_group, retries: 0, breaker_failures: 0}}\n",
                    &set)
              .ok());
  CHECK(set.reward().call().retries() == 0);  // an explicit 0 stays 0
  CHECK(set.reward().call().breaker_failures() == 0);
  CHECK(message("rollout: {request_timeout_ms: -1}\n").find("rollout.request_timeout_ms: must be >= 0") !=
        std::string::npos);
  CHECK(message("rollout: {request_timeout_ms: 5, on_timeout: skip}\n")
            .find("rollout.on_timeout: must be redispatch or drop") != std::string::npos);
  CHECK(message("rollout: {on_timeout: drop}\n").find("rollout.on_timeout: set without rollout.request_timeout_ms") !=
        std::string::npos);
  CHECK(defaults.rollout().tp() == 1);
  CHECK(message("rollout: {tp: -2}\n").find("rollout.tp: must be in [1, 64]") != std::string::npos);
  CHECK(message("rollout: {tp: 2, device: cuda}\n").find("rollout.tp: > 1 generates on the CPU only") !=
        std::string::npos);
  ExperimentConfig tp2;
  REQUIRE(Normalize(base + "rollout: {tp: 2}\n", &tp2).ok());
  CHECK(tp2.rollout().tp() == 2);
  CHECK(message("reward: {call: {on_failure: ignore}}\n")
            .find("reward.call.on_failure: must be retry, zero or drop_group") != std::string::npos);
  CHECK(message("reward: {call: {retries: 101}}\n").find("reward.call.retries: must be in [0, 100]") !=
        std::string::npos);
  CHECK(message("reward: {call: {timeout_ms: -5}}\n").find("reward.call.timeout_ms: must be >= 0") !=
        std::string::npos);
  CHECK(message("reward: {call: {breaker_failures: -1}}\n").find("reward.call.breaker_failures") != std::string::npos);
  CHECK(message("reward: {call: {breaker_cooldown_ms: -1}}\n").find("reward.call.breaker_cooldown_ms: must be > 0") !=
        std::string::npos);
}

TEST_CASE("rollout.sleep, learner.sleep and the CUDA memory fractions are checked by name") {
  const std::string grpo = "stages: [{grpo: {rl: {steps: 1, prompts_per_step: 1, optimizer: {lr: 0.001}}}}]\n";
  auto check = [&](const std::string& yaml, const std::string& message) {
    ExperimentConfig cfg;
    absl::Status s = Normalize("name: x\n" + yaml, &cfg);
    INFO(yaml << " -> " << s.ToString());
    if (message.empty()) {
      CHECK(s.ok());
    } else {
      CHECK(s.code() == absl::StatusCode::kInvalidArgument);
      CHECK(s.message().find(message) != absl::string_view::npos);
    }
  };
  for (const char* ok : {"off", "cache", "weights"}) check(std::string("rollout: {sleep: ") + ok + "}\n" + grpo, "");
  check("rollout: {sleep: always}\n" + grpo, "rollout.sleep: must be off, cache or weights");
  check("learner: {sleep: cache}\n" + grpo, "");
  check("learner: {sleep: weights}\n" + grpo, "learner.sleep: must be off or cache");
  check("rollout: {sleep: weights}\nstages: [{grpo: {rl: {steps: 1, prompts_per_step: 1, max_staleness: 1, "
        "optimizer: {lr: 0.001}}}}]\n",
        "rollout.sleep: needs synchronous RL (stages[0].grpo.rl.max_staleness > 0");
  check("rollout: {sleep: cache}\nstages: [{ppo: {rl: {steps: 1, prompts_per_step: 1, max_staleness: 2, "
        "optimizer: {lr: 0.001}}}}]\n",
        "rollout.sleep: needs synchronous RL (stages[0].ppo.rl.max_staleness > 0");
  // The caps: only on a GPU, in (0, 1], and the learners' and the workers'
  // on one GPU together at most 1.
  check("model: {device: cuda}\nlearner: {cuda_memory_fraction: 0.5}\nrollout: {cuda_memory_fraction: 0.4}\n" + grpo,
        "");
  check("learner: {cuda_memory_fraction: 0.5}\n" + grpo,
        "learner.cuda_memory_fraction: set but the learners train on the CPU");
  check("model: {device: cuda}\nrollout: {device: cpu, cuda_memory_fraction: 0.5}\n" + grpo,
        "rollout.cuda_memory_fraction: set but the workers generate on the CPU");
  check("model: {device: cuda}\nrollout: {cuda_memory_fraction: 1.5}\n" + grpo,
        "rollout.cuda_memory_fraction: must be in (0, 1]");
  check("model: {device: cuda}\nlearner: {cuda_memory_fraction: -0.1}\n" + grpo,
        "learner.cuda_memory_fraction: must be in (0, 1]");
  check("model: {device: \"cuda:0\"}\nlearner: {cuda_memory_fraction: 0.5}\n"
        "rollout: {device: cuda, workers: 2, cuda_memory_fraction: 0.3}\n" + grpo,
        "learner.cuda_memory_fraction + rollout.workers x rollout.cuda_memory_fraction = 1.1 > 1 on the GPU that "
        "learner 0 and the workers share");
  // Only learner 0 shares the workers' GPU; shard k trains on the GPU k
  // after it (PlaceLearnerShardsOnGpus).
  check("model: {device: \"cuda:0\"}\nlearner: {shards: 2, cuda_memory_fraction: 0.5}\n"
        "rollout: {device: cuda, workers: 1, cuda_memory_fraction: 0.5}\n" + grpo,
        "");
  check("model: {device: \"cuda:62\"}\nlearner: {shards: 3}\n" + grpo,
        "learner.shards: 3 shards from GPU 62 (model.device) need GPUs up to 64, past the last index 63");
  check("rollout: {cuda_graphs: true}\n" + grpo,
        "rollout.cuda_graphs: set but the workers generate on the CPU (rollout.device / model.device)");
  check("model: {device: cuda}\nrollout: {cuda_graphs: true}\n" + grpo, "");
  // On two GPUs each has its own.
  check("model: {device: \"cuda:0\"}\nlearner: {cuda_memory_fraction: 0.9}\n"
        "rollout: {device: \"cuda:1\", cuda_memory_fraction: 0.9}\n" + grpo,
        "");
}

TEST_CASE("coordinator run gives several learner shards on GPUs one GPU each") {
  const std::string grpo = "stages: [{grpo: {rl: {steps: 1, prompts_per_step: 1, optimizer: {lr: 0.001}}}}]\n";
  auto place = [&](const std::string& yaml, std::string* device) {
    ExperimentConfig cfg;
    const absl::Status s = Normalize("name: x\n" + yaml + grpo, &cfg);
    INFO(s.ToString());
    REQUIRE(s.ok());
    std::vector<int> gpus = PlaceLearnerShardsOnGpus(&cfg);
    *device = cfg.model().device();
    return gpus;
  };
  std::string device;
  // From model.device's GPU on; inside each shard's process its one GPU is "cuda".
  CHECK(place("model: {device: \"cuda:2\"}\nlearner: {shards: 3}\n", &device) == std::vector<int>{2, 3, 4});
  CHECK(device == "cuda");
  CHECK(place("model: {device: cuda}\nlearner: {shards: 2}\n", &device) == std::vector<int>{0, 1});
  CHECK(device == "cuda");
  // One shard trains on model.device itself; the CPU has no GPUs to hand out.
  CHECK(place("model: {device: \"cuda:2\"}\n", &device).empty());
  CHECK(device == "cuda:2");
  CHECK(place("learner: {shards: 2}\n", &device).empty());
  CHECK(device == "");
}

TEST_CASE("every shipped config loads and validates") {
  for (const char* name : {"grpo_arith_tiny", "grpo_arith_tiny_gspo", "ppo_arith_tiny", "grpo_arith_e2e", "dpo_arith_tiny", "rm_arith_tiny",
                           "sft_word_problems", "sft_word_problems_qwen3", "grpo_word_problems_qwen3",
                           "grpo_countdown_tiny", "sft_word_problems_chat_qwen3", "cpt_text_sample"}) {
    INFO(name);
    ExperimentConfig cfg;
    YamlSource src;
    REQUIRE(LoadYamlFile(testing::Runfile(std::string("configs/") + name + ".yaml"), &cfg, &src).ok());
    absl::Status s = NormalizeExperiment(&cfg, src);
    INFO(s.ToString());
    CHECK(s.ok());
  }
}

TEST_CASE("chat and text dataset fields are checked by name") {
  auto refused = [](const std::string& task, const std::string& stages, const std::string& expected) {
    ExperimentConfig cfg;
    absl::Status s = Normalize("name: x\nmodel: {max_positions: 64}\ntask: " + task + "\nstages: " + stages + "\n", &cfg);
    INFO(s.ToString());
    CHECK(s.message().find(expected) != absl::string_view::npos);
  };
  const std::string sft = "[{sft: {steps: 1, batch: 1, optimizer: {lr: 0.001}}}]";
  const std::string grpo = "[{grpo: {rl: {steps: 1, prompts_per_step: 1, optimizer: {lr: 0.001}}}}]";
  refused("{kind: chats}", sft, "task.kind: must be arithmetic, countdown, jsonl, chat or text");
  refused("{kind: chat, chat_template: model}", sft, "task.train_path: required for kind chat");
  refused("{kind: chat, train_path: a.jsonl}", sft, "task.chat_template: required for kind chat");
  refused("{kind: chat, train_path: a.jsonl, chat_template: model, prompt_template: 'Q: {prompt}'}", sft,
          "task.prompt_template: not used by kind chat");
  refused("{kind: jsonl, messages_field: m}", sft, "task.messages_field: only for kind chat");
  refused("{kind: chat, text_field: t}", sft, "task.text_field: only for kind text");
  refused("{kind: jsonl, sequence_length: 8}", sft, "task.sequence_length: only for kind text");
  refused("{kind: text}", sft, "task.train_path: required for kind text");
  refused("{kind: text, train_path: c.jsonl, sequence_length: 65}", sft, "task.sequence_length: must be in [0, model.max_positions]");
  refused("{kind: text, train_path: c.jsonl, eval_path: d.jsonl}", sft, "task.eval_path: not used by kind text");
  refused("{kind: text, train_path: c.jsonl, chat_template: model}", sft, "task.chat_template: not used by kind text");
  refused("{kind: text, train_path: c.jsonl}", grpo, "stages[0]: task kind text trains SFT stages only");
  refused("{kind: text, train_path: c.jsonl}", "[{sft: {steps: 1, batch: 1, optimizer: {lr: 0.001}, until: {eval_accuracy: 0.5}}}]",
          "stages[0].sft.until.eval_accuracy: must be 0 with task kind text");
  ExperimentConfig ok;
  CHECK(Normalize("name: x\ntask: {kind: text, train_path: c.jsonl, text_field: body, sequence_length: 64}\nstages: " +
                      sft + "\n",
                  &ok)
            .ok());
}

}  // namespace
}  // namespace rlmesh
