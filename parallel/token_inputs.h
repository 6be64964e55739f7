#pragma once

// The checks the model-parallel layouts (TensorParallelModel,
// FullyShardedModel) make on TokenLogProbs' inputs before any collective, so
// that bad input is refused on every rank alike instead of failing inside a
// collective.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"

namespace rlmesh::parallel {

// OK when temperature > 0, input_ids, positions and targets are int64 [B,T]
// of one shape, the ids are in [0, vocab_size) and the targets below
// vocab_size (negative targets are masked). INVALID_ARGUMENT naming the
// input otherwise.
absl::Status ValidateTokenInputs(const at::Tensor& input_ids, const at::Tensor& positions, const at::Tensor& targets,
                                 double temperature, int64_t vocab_size);

}  // namespace rlmesh::parallel
