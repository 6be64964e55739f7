#pragma once

// The rules of proto/config.proto's ExperimentConfig: the range checks and
// defaults its comments state, in one place. The coordinator normalises a
// config when it reads it, and each learner again on what it is sent, so
// the roles can only read what this accepted, with every default written.
// Errors name the key path (and the YAML line when the key was written in a
// file).

#include <string>

#include "absl/status/status.h"
#include "common/proto_yaml.h"
#include "proto/config.pb.h"

namespace rlmesh {

// Fills every default the engine relies on (documented in proto/
// config.proto: "0 = the default ...") and checks every range. `source`
// maps key paths to lines; may be empty. A normalised config normalises to
// itself.
absl::Status NormalizeExperiment(ExperimentConfig* config, const YamlSource& source);

// "sft", "grpo", "ppo", "dpo", "reward_model".
std::string StageKind(const Stage& stage);
// stage.name or its kind.
std::string StageName(const Stage& stage);
// The RL settings of a GRPO or PPO stage; null for other kinds.
const RlStage* RlSettings(const Stage& stage);
// Whether rollout.sleep asks the workers to sleep while the learner trains
// ("cache" or "weights"; "" and "off" do not).
bool RolloutSleeps(const RolloutConfig& rollout);

// True when `stage` trains LoRA adapters (model.lora.rank > 0 and the stage's
// kind is in model.lora.stages, or that list is empty).
bool LoraTrains(const ExperimentConfig& experiment, const Stage& stage);

}  // namespace rlmesh
