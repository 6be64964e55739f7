#pragma once

// Range checks and defaults of an ExperimentConfig. Errors name the key path
// (and the YAML line when the key was written in a file).

#include <string>
#include <vector>

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

// `coordinator run`'s learners on GPUs. One shard trains on model.device
// itself. Several shards (data parallelism over NCCL, which refuses two
// ranks on one device) take a GPU each: with model.device cuda:i, shard k
// takes GPU i + k, which its launcher makes its only visible device
// (CUDA_VISIBLE_DEVICES), so model.device becomes "cuda" for them. Returns
// the GPU of each shard in order; empty (config unchanged) on the CPU or
// for one shard. REQUIRES: a normalized config.
std::vector<int> PlaceLearnerShardsOnGpus(ExperimentConfig* config);

}  // namespace rlmesh
