#pragma once

// Range checks and defaults of an ExperimentConfig. Errors name the key path
// (and the YAML line when the key was written in a file).

#include <string>

#include "absl/status/status.h"
#include "common/proto_yaml.h"
#include "proto/config.pb.h"

namespace rlmesh {

// Fills defaults the engine relies on (documented in proto/config.proto)
// and checks every range. `source` maps key paths to lines; may be empty.
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

}  // namespace rlmesh
