#pragma once

// The coordinator's readings of a normalised ExperimentConfig; the
// normaliser itself is schema/experiment.h.

#include <string>
#include <vector>

#include "proto/config.pb.h"
#include "schema/experiment.h"

namespace rlmesh {

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
