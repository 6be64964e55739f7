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
// The parameter dtype `coordinator run`'s workers on `device` generate in:
// rollout.dtype, else "bf16" on a CUDA device and "fp32" on the CPU.
std::string RolloutDtype(const RolloutConfig& rollout, const std::string& device);
// The weight-sync (TensorSlot) name of a config dtype: "fp32" -> "f32",
// "bf16" -> "bf16", "fp16" -> "f16"; "" for any other text.
std::string WeightSyncDtypeName(const std::string& config_dtype);

// `coordinator run`'s learners on GPUs. One shard trains on model.device
// itself. Several shards (data parallelism over NCCL, which refuses two
// ranks on one device) take a GPU each: with model.device cuda:i, shard k
// takes GPU i + k, which its launcher makes its only visible device
// (CUDA_VISIBLE_DEVICES), so model.device becomes "cuda" for them. Returns
// the GPU of each shard in order; empty (config unchanged) on the CPU or
// for one shard. REQUIRES: a normalized config.
std::vector<int> PlaceLearnerShardsOnGpus(ExperimentConfig* config);

}  // namespace rlmesh
