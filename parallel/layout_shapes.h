#pragma once

// The shapes of the model-parallel layouts, as arithmetic on the model's
// config (no LibTorch): what each rank of a tensor-parallel group or a
// pipeline stage holds. The layouts themselves (parallel/tensor_parallel.h,
// learner/pipeline_parallel.h) build their shards from these, and the
// coordinator's memory plan (coordinator/memory_plan.h) counts with them,
// so the plan and the learner cannot disagree about who holds what.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "actor/model_config.h"

namespace rlmesh::parallel {

// Parameters of a model of this shape, as Hugging Face counts them (a tied
// lm_head once; a value head's score vector included).
int64_t ParameterCount(const actor::ModelConfig& config);

// Parameters of decoder layer `layer` (its norms, attention and MLP or
// experts).
int64_t DecoderLayerParameters(const actor::ModelConfig& config, int64_t layer);

// The shape of one tensor-parallel rank's shard: heads, KV heads,
// intermediate size and vocabulary divided by tp, the head dimension kept.
// REQUIRES: tp divides them (ValidateTensorParallel).
actor::ModelConfig TensorParallelShardConfig(const actor::ModelConfig& config, int tp);

// Decoder layers per pipeline stage, balanced by parameter count: the
// split into `stages` contiguous runs (each at least one layer) whose
// largest stage, counting the embedding on the first and the final norm
// and output projection on the last, is smallest; among equal splits the
// later stages hold fewer layers. INVALID_ARGUMENT naming learner.pp when
// stages is outside [1, num_layers].
absl::StatusOr<std::vector<int64_t>> BalancedStageLayers(const actor::ModelConfig& config, int stages);

// Decoder layers per model chunk of a pipeline of `stages` stages with
// `virtual_stages` chunks each, in model order (chunk c on stage c % P):
// BalancedStageLayers for one chunk per stage; for the interleaved
// schedule's P x V chunks, the layers spread evenly (the first chunks after
// the embedding's taking one more each when P x V does not divide them), as
// Megatron does, so that every stage runs the same layers; balancing each
// chunk by parameter count instead can leave one stage three times
// another's layers when the embedding weighs several layers.
// INVALID_ARGUMENT naming learner.pp or learner.pp_virtual_stages when a
// chunk would have no layer.
absl::StatusOr<std::vector<int64_t>> PipelineChunkLayers(const actor::ModelConfig& config, int stages,
                                                         int virtual_stages);

// The parameters each stage of a pipeline with `stage_layers` holds: its
// layers', plus the embedding on the first stage and the final norm and
// output projection on the last (with tied embeddings the last stage's
// copy of the embedding, which it holds and trains as its head).
// REQUIRES: stage_layers sum to num_layers, each >= 1.
std::vector<int64_t> StageParameterCounts(const actor::ModelConfig& config, const std::vector<int64_t>& stage_layers);

}  // namespace rlmesh::parallel
