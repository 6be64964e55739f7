#include "learner/advantages.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>
#include <vector>

#include "common/status_macros.h"
#include "learner/tensor_checks.h"

namespace rlmesh::learner {
namespace {

using internal::CatchTorch;
using internal::CheckSameShape;
using internal::CheckTensor;

// Everything is computed in float64 and returned as float32: rewards are few
// and the recursions below accumulate, so the extra precision is free.
at::Tensor F64(const at::Tensor& t) { return t.to(at::kDouble); }
at::Tensor Binary(const at::Tensor& mask) { return mask.ne(0).to(at::kDouble); }
at::Tensor Out(const at::Tensor& t) { return t.to(at::kFloat); }

absl::Status CheckMask(const at::Tensor& mask) {
  return CheckTensor(mask, "mask", 2, /*allow_integral=*/true);
}

absl::Status CheckGroups(const at::Tensor& rewards, int64_t min_n) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(rewards, "rewards", 2));
  if (rewards.size(1) < min_n) {
    return absl::InvalidArgumentError(absl::StrCat("rewards: groups need at least ", min_n,
                                                   " samples, got shape ",
                                                   internal::ShapeString(rewards)));
  }
  return absl::OkStatus();
}

absl::Status CheckSequenceRewards(const at::Tensor& rewards, const at::Tensor& mask) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(rewards, "rewards", 1));
  RLMESH_RETURN_IF_ERROR(CheckMask(mask));
  if (rewards.size(0) != mask.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("rewards: ", rewards.size(0),
                                                   " sequences but mask has ", mask.size(0),
                                                   " rows"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptionalKl(const at::Tensor& kl, const at::Tensor& mask, double kl_coef) {
  if (!kl.defined()) {
    if (kl_coef != 0.0) return absl::InvalidArgumentError("kl: kl_coef != 0 but kl is undefined");
    return absl::OkStatus();
  }
  RLMESH_RETURN_IF_ERROR(CheckTensor(kl, "kl", 2));
  return CheckSameShape(mask, "mask", kl, "kl");
}

// Same as TokenRewards, on validated inputs, in float64.
at::Tensor TokenRewardsImpl(const at::Tensor& rewards, const at::Tensor& m, const at::Tensor& kl,
                            double kl_coef) {
  const int64_t T = m.size(1);
  at::Tensor idx = at::arange(T, m.options().dtype(at::kLong)).unsqueeze(0).expand_as(m);
  // Index of the last masked token per row, -1 for an empty row.
  at::Tensor last = at::where(m.gt(0), idx, at::full_like(idx, -1)).amax(1);
  at::Tensor has_any = last.ge(0).to(at::kDouble);
  at::Tensor out = at::zeros_like(m);
  out.scatter_(1, last.clamp_min(0).unsqueeze(1), (F64(rewards) * has_any).unsqueeze(1));
  if (kl.defined() && kl_coef != 0.0) out = out - kl_coef * F64(kl);
  return out * m;
}

// Bessel-corrected whitening over masked positions (of every rank when
// `global_sum` is set); validated inputs.
absl::StatusOr<at::Tensor> WhitenImpl(const at::Tensor& x, const at::Tensor& m, bool shift_mean,
                                      double eps, const GlobalSum& global_sum = nullptr) {
  at::Tensor first = at::stack({(x * m).sum(), m.sum()}).to(at::kDouble).cpu().contiguous();
  if (global_sum) RLMESH_RETURN_IF_ERROR(global_sum(first));
  const double n = first[1].item<double>();
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask: whitening needs at least 2 masked tokens, got ", n));
  }
  const double mean = first[0].item<double>() / n;
  at::Tensor centered = (x - mean) * m;
  at::Tensor second = (centered * centered).sum().reshape({1}).to(at::kDouble).cpu().contiguous();
  if (global_sum) RLMESH_RETURN_IF_ERROR(global_sum(second));
  const double var = second[0].item<double>() / (n - 1);
  at::Tensor w = centered * (1.0 / std::sqrt(var + eps));
  if (!shift_mean) w = w + mean;
  return w * m;
}

}  // namespace

absl::StatusOr<at::Tensor> GrpoAdvantages(const at::Tensor& rewards, bool scale_by_std,
                                          double eps) {
  RLMESH_RETURN_IF_ERROR(CheckGroups(rewards, scale_by_std ? 2 : 1));
  if (!(eps >= 0)) return absl::InvalidArgumentError("eps: must be >= 0");
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    at::Tensor r = F64(rewards);
    at::Tensor a = r - r.mean(1, /*keepdim=*/true);
    if (scale_by_std) a = a / (r.std(1, /*unbiased=*/true, /*keepdim=*/true) + eps);
    return Out(a);
  });
}

absl::StatusOr<at::Tensor> RlooAdvantages(const at::Tensor& rewards) {
  RLMESH_RETURN_IF_ERROR(CheckGroups(rewards, 2));
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    at::Tensor r = F64(rewards);
    const double n = static_cast<double>(r.size(1));
    at::Tensor others_mean = (r.sum(1, /*keepdim=*/true) - r) / (n - 1);
    return Out(r - others_mean);
  });
}

absl::StatusOr<at::Tensor> ExpandToTokens(const at::Tensor& per_sequence, const at::Tensor& mask) {
  RLMESH_RETURN_IF_ERROR(CheckMask(mask));
  if (!per_sequence.defined() || !per_sequence.is_floating_point()) {
    return absl::InvalidArgumentError("per_sequence: expected a defined floating-point tensor");
  }
  if (per_sequence.numel() != mask.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("per_sequence: ", per_sequence.numel(),
                                                   " values but mask has ", mask.size(0),
                                                   " rows"));
  }
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    return Out(F64(per_sequence).reshape({-1, 1}) * Binary(mask));
  });
}

absl::StatusOr<at::Tensor> TokenRewards(const at::Tensor& rewards, const at::Tensor& mask,
                                        const at::Tensor& kl, double kl_coef) {
  RLMESH_RETURN_IF_ERROR(CheckSequenceRewards(rewards, mask));
  RLMESH_RETURN_IF_ERROR(CheckOptionalKl(kl, mask, kl_coef));
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    return Out(TokenRewardsImpl(rewards, Binary(mask), kl, kl_coef));
  });
}

absl::StatusOr<at::Tensor> WhitenMasked(const at::Tensor& x, const at::Tensor& mask,
                                        bool shift_mean, double eps, const GlobalSum& global_sum) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(x, "x", 2));
  RLMESH_RETURN_IF_ERROR(CheckMask(mask));
  RLMESH_RETURN_IF_ERROR(CheckSameShape(x, "x", mask, "mask"));
  if (!(eps >= 0)) return absl::InvalidArgumentError("eps: must be >= 0");
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    RLMESH_ASSIGN_OR_RETURN(at::Tensor w, WhitenImpl(F64(x), Binary(mask), shift_mean, eps, global_sum));
    return Out(w);
  });
}

absl::StatusOr<at::Tensor> ReinforcePlusPlusAdvantages(const at::Tensor& rewards,
                                                       const at::Tensor& mask,
                                                       const at::Tensor& kl, double kl_coef,
                                                       double gamma, const GlobalSum& global_sum) {
  RLMESH_RETURN_IF_ERROR(CheckSequenceRewards(rewards, mask));
  RLMESH_RETURN_IF_ERROR(CheckOptionalKl(kl, mask, kl_coef));
  if (!(gamma >= 0 && gamma <= 1)) return absl::InvalidArgumentError("gamma: must be in [0, 1]");
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    at::Tensor m = Binary(mask);
    at::Tensor r = TokenRewardsImpl(rewards, m, kl, kl_coef);
    at::Tensor returns;
    if (gamma == 1.0) {
      // Rewards are 0 off the mask, so a reverse cumulative sum is exact.
      returns = r.flip({1}).cumsum(1).flip({1}) * m;
    } else {
      const int64_t T = m.size(1);
      std::vector<at::Tensor> cols(T);
      at::Tensor running = at::zeros({m.size(0)}, m.options());
      for (int64_t t = T - 1; t >= 0; --t) {
        at::Tensor mt = m.select(1, t);
        running = at::where(mt.gt(0), r.select(1, t) + gamma * running, running);
        cols[t] = running * mt;
      }
      returns = at::stack(cols, 1);
    }
    RLMESH_ASSIGN_OR_RETURN(at::Tensor w, WhitenImpl(returns, m, /*shift_mean=*/true, 1e-8, global_sum));
    return Out(w);
  });
}

absl::Status GaeOptions::Validate() const {
  if (!(gamma >= 0 && gamma <= 1)) return absl::InvalidArgumentError("gamma: must be in [0, 1]");
  if (!(lam >= 0 && lam <= 1)) return absl::InvalidArgumentError("lam: must be in [0, 1]");
  if (!(kl_coef >= 0)) return absl::InvalidArgumentError("kl_coef: must be >= 0");
  return absl::OkStatus();
}

absl::StatusOr<GaeResult> GaeAdvantages(const at::Tensor& rewards, const at::Tensor& values,
                                        const at::Tensor& mask, const GaeOptions& options,
                                        const at::Tensor& kl) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  RLMESH_RETURN_IF_ERROR(CheckSequenceRewards(rewards, mask));
  RLMESH_RETURN_IF_ERROR(CheckTensor(values, "values", 2));
  RLMESH_RETURN_IF_ERROR(CheckSameShape(mask, "mask", values, "values"));
  RLMESH_RETURN_IF_ERROR(CheckOptionalKl(kl, mask, options.kl_coef));
  return CatchTorch([&]() -> absl::StatusOr<GaeResult> {
    at::Tensor m = Binary(mask);
    at::Tensor r = TokenRewardsImpl(rewards, m, kl, options.kl_coef);
    at::Tensor v = F64(values);
    const int64_t T = m.size(1);
    std::vector<at::Tensor> cols(T);
    at::Tensor next_value = at::zeros({m.size(0)}, m.options());
    at::Tensor next_adv = at::zeros({m.size(0)}, m.options());
    for (int64_t t = T - 1; t >= 0; --t) {
      at::Tensor on = m.select(1, t).gt(0);
      at::Tensor vt = v.select(1, t);
      at::Tensor delta = r.select(1, t) + options.gamma * next_value - vt;
      at::Tensor adv = delta + options.gamma * options.lam * next_adv;
      // Off-mask positions (prompt, padding) neither produce an advantage
      // nor interrupt the recursion between the tokens around them.
      next_adv = at::where(on, adv, next_adv);
      next_value = at::where(on, vt, next_value);
      cols[t] = adv * m.select(1, t);
    }
    at::Tensor adv = at::stack(cols, 1);
    GaeResult result;
    result.returns = Out((adv + v) * m);
    if (options.whiten) {
      RLMESH_ASSIGN_OR_RETURN(adv, WhitenImpl(adv, m, /*shift_mean=*/true, 1e-8, options.global_sum));
    }
    result.advantages = Out(adv);
    return result;
  });
}

absl::StatusOr<at::Tensor> OverlongPenalty(const at::Tensor& lengths, int64_t max_length,
                                           int64_t buffer, double penalty) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(lengths, "lengths", 1, /*allow_integral=*/true));
  if (buffer <= 0 || buffer > max_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer: must be in (0, max_length=", max_length, "], got ", buffer));
  }
  if (!(penalty >= 0)) return absl::InvalidArgumentError("penalty: must be >= 0");
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    const double expected = static_cast<double>(max_length - buffer);
    at::Tensor exceed = F64(lengths) - expected;
    return Out((-exceed / static_cast<double>(buffer) * penalty).clamp_max(0.0));
  });
}

absl::StatusOr<at::Tensor> ZeroVarianceGroups(const at::Tensor& rewards, double tolerance) {
  RLMESH_RETURN_IF_ERROR(CheckGroups(rewards, 1));
  if (!(tolerance >= 0)) return absl::InvalidArgumentError("tolerance: must be >= 0");
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    at::Tensor r = F64(rewards);
    return (r.amax(1) - r.amin(1)).le(tolerance);
  });
}

}  // namespace rlmesh::learner
