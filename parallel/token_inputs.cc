#include "parallel/token_inputs.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace rlmesh::parallel {

absl::Status ValidateTokenInputs(const at::Tensor& ids, const at::Tensor& positions, const at::Tensor& targets,
                                 double temperature, int64_t vocab_size) {
  if (!(temperature > 0)) return absl::InvalidArgumentError("temperature: must be > 0");
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"input_ids", ids},
                                {"positions", positions},
                                {"targets", targets}}) {
    if (!t.defined() || t.dim() != 2 || t.scalar_type() != at::kLong || !ids.defined() || t.sizes() != ids.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected int64 [B,T] matching input_ids"));
    }
  }
  if (ids.numel() == 0) return absl::OkStatus();
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  const int64_t tmax = targets.max().item<int64_t>();
  if (lo < 0 || hi >= vocab_size || tmax >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("input_ids and targets: ids must be in [0, ", vocab_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::parallel
