#include "learner/mismatch.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "learner/device_metrics.h"
#include "learner/tensor_checks.h"

namespace rlmesh::learner {
namespace {

using internal::CatchTorch;
using internal::CheckSameShape;
using internal::CheckTensor;

}  // namespace

absl::StatusOr<MismatchMode> ParseMismatchMode(absl::string_view name) {
  if (name == "none") return MismatchMode::kNone;
  if (name == "tis") return MismatchMode::kTis;
  if (name == "mis") return MismatchMode::kMis;
  if (name == "icepop") return MismatchMode::kIcePop;
  return absl::InvalidArgumentError(
      absl::StrCat("mismatch.mode: unknown mode \"", name, "\" (none, tis, mis, icepop)"));
}

absl::StatusOr<MismatchLevel> ParseMismatchLevel(absl::string_view name) {
  if (name == "token") return MismatchLevel::kToken;
  if (name == "sequence") return MismatchLevel::kSequence;
  return absl::InvalidArgumentError(
      absl::StrCat("mismatch.level: unknown level \"", name, "\" (token, sequence)"));
}

absl::Status MismatchOptions::Validate() const {
  if (!std::isfinite(low) || !std::isfinite(high)) {
    return absl::InvalidArgumentError("mismatch: low and high must be finite");
  }
  if (mode == MismatchMode::kIcePop) {
    if (!(low > 0 && low <= 1)) return absl::InvalidArgumentError("mismatch.low: must be in (0, 1] for icepop");
  } else if (low != 0) {
    return absl::InvalidArgumentError("mismatch.low: only mode icepop has a lower bound");
  }
  switch (mode) {
    case MismatchMode::kNone:
      return absl::OkStatus();
    case MismatchMode::kTis:
      if (high == 0 && level == MismatchLevel::kSequence) {
        return absl::InvalidArgumentError("mismatch.high: sequence-level tis needs a cap (a product of token "
                                          "weights is unbounded)");
      }
      if (!(high >= 0)) return absl::InvalidArgumentError("mismatch.high: must be >= 0 (0 = no cap)");
      return absl::OkStatus();
    case MismatchMode::kMis:
    case MismatchMode::kIcePop:
      if (!(high >= 1)) return absl::InvalidArgumentError("mismatch.high: must be >= 1");
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::StatusOr<MismatchWeights> MismatchCorrection(const at::Tensor& old_logp, const at::Tensor& behaviour_logp,
                                                   const at::Tensor& mask, const MismatchOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  RLMESH_RETURN_IF_ERROR(CheckTensor(mask, "mask", 2, /*allow_integral=*/true));
  RLMESH_RETURN_IF_ERROR(CheckTensor(old_logp, "old_logp", 2));
  RLMESH_RETURN_IF_ERROR(CheckTensor(behaviour_logp, "behaviour_logp", 2));
  RLMESH_RETURN_IF_ERROR(CheckSameShape(mask, "mask", old_logp, "old_logp"));
  RLMESH_RETURN_IF_ERROR(CheckSameShape(mask, "mask", behaviour_logp, "behaviour_logp"));
  return CatchTorch([&]() -> absl::StatusOr<MismatchWeights> {
    const at::Tensor on = mask.ne(0);
    const at::Tensor zero = at::zeros({}, old_logp.options());
    // log w per token, exactly 0 off the mask (NaN there cannot leak).
    const at::Tensor log_w =
        at::where(on, old_logp.detach(), zero) - at::where(on, behaviour_logp.detach(), zero);
    const at::Tensor raw_w = at::exp(log_w);
    MismatchWeights out;
    DeviceMetrics dm;
    dm.AddMaskedMean("mismatch_kl", raw_w - 1.0 - log_w, on);
    dm.AddMaskedMean("mismatch_k1", -log_w, on);
    dm.AddMaskedMean("mismatch_abs_diff", log_w.abs(), on);

    // The quantity compared with the bounds, in log space: per token, or the
    // row's summed log-weight broadcast over its tokens.
    const at::Tensor log_x =
        options.level == MismatchLevel::kToken ? log_w : log_w.sum(1, /*keepdim=*/true).expand_as(log_w);
    at::Tensor keep = on;
    at::Tensor truncated = at::zeros_like(on);
    at::Tensor w;
    switch (options.mode) {
      case MismatchMode::kNone:
        w = at::ones_like(log_w);
        break;
      case MismatchMode::kTis:
        if (options.high > 0) {
          // Token level: the very expression PolicyLoss used for
          // importance_cap, so existing runs reproduce bit for bit.
          w = options.level == MismatchLevel::kToken ? raw_w.clamp_max(options.high)
                                                     : at::exp(log_x.clamp_max(std::log(options.high)));
          truncated = (options.level == MismatchLevel::kToken ? raw_w.gt(options.high)
                                                              : log_x.gt(std::log(options.high)))
                          .logical_and(on);
        } else {
          w = raw_w;
        }
        break;
      case MismatchMode::kMis:
        keep = on.logical_and(log_x.le(std::log(options.high)));
        w = at::exp(log_x);
        break;
      case MismatchMode::kIcePop:
        keep = on.logical_and(log_x.le(std::log(options.high))).logical_and(log_x.ge(std::log(options.low)));
        w = at::exp(log_x);
        break;
    }
    out.weight = at::where(keep, w, zero);
    out.keep = keep;
    dm.AddMaskedMean("mismatch_masked_frac", on.logical_and(keep.logical_not()), on);
    dm.AddMaskedMean("mismatch_truncated_frac", truncated, on);
    dm.AddMaskedMean("mismatch_weight_mean", out.weight, keep, 1.0);
    dm.ReadInto(&out.metrics);
    return out;
  });
}

}  // namespace rlmesh::learner
