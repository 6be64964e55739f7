#include "learner/schedule.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"
#include "learner/tensor_checks.h"

namespace rlmesh::learner {

absl::Status AdamWOptions::Validate() const {
  if (!(beta1 >= 0 && beta1 < 1)) return absl::InvalidArgumentError("beta1: must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) return absl::InvalidArgumentError("beta2: must be in [0, 1)");
  if (!(eps > 0)) return absl::InvalidArgumentError("eps: must be > 0");
  if (!(weight_decay >= 0)) return absl::InvalidArgumentError("weight_decay: must be >= 0");
  return absl::OkStatus();
}

absl::Status AdamWUpdate(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                         at::Tensor& exp_avg_sq, int64_t step, double lr,
                         const AdamWOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  if (step < 1) return absl::InvalidArgumentError("step: must be >= 1");
  if (!(lr >= 0)) return absl::InvalidArgumentError("lr: must be >= 0");
  if (!param.defined() || !grad.defined() || !exp_avg.defined() || !exp_avg_sq.defined()) {
    return absl::InvalidArgumentError("param/grad/exp_avg/exp_avg_sq: all must be defined");
  }
  RLMESH_RETURN_IF_ERROR(internal::CheckSameShape(param, "param", grad, "grad"));
  RLMESH_RETURN_IF_ERROR(internal::CheckSameShape(param, "param", exp_avg, "exp_avg"));
  RLMESH_RETURN_IF_ERROR(internal::CheckSameShape(param, "param", exp_avg_sq, "exp_avg_sq"));
  return internal::CatchTorch([&]() -> absl::Status {
    // The same operation sequence as torch::optim::AdamW, so that a single
    // process using it and a sharded one using this agree to the last bit.
    at::NoGradGuard no_grad;
    if (options.weight_decay != 0) param.mul_(1.0 - lr * options.weight_decay);
    exp_avg.mul_(options.beta1).add_(grad, 1.0 - options.beta1);
    exp_avg_sq.mul_(options.beta2).addcmul_(grad, grad, 1.0 - options.beta2);
    const double bias1 = 1.0 - std::pow(options.beta1, static_cast<double>(step));
    const double bias2 = 1.0 - std::pow(options.beta2, static_cast<double>(step));
    at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(options.eps);
    param.addcdiv_(exp_avg, denom, -lr / bias1);
    return absl::OkStatus();
  });
}

absl::Status LrScheduleOptions::Validate() const {
  if (!(peak_lr > 0)) return absl::InvalidArgumentError("peak_lr: must be > 0");
  if (warmup_steps < 0) return absl::InvalidArgumentError("warmup_steps: must be >= 0");
  if (total_steps < 1) return absl::InvalidArgumentError("total_steps: must be >= 1");
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1)) {
    return absl::InvalidArgumentError("min_lr_ratio: must be in [0, 1]");
  }
  return absl::OkStatus();
}

double LearningRate(const LrScheduleOptions& o, int64_t step) {
  if (step < 0) step = 0;
  if (step < o.warmup_steps) {
    return o.peak_lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  }
  if (o.decay == LrDecay::kConstant) return o.peak_lr;
  const double floor = o.peak_lr * o.min_lr_ratio;
  const int64_t span = o.total_steps - o.warmup_steps;
  double progress = span <= 0 ? 1.0
                              : static_cast<double>(step - o.warmup_steps) /
                                    static_cast<double>(span);
  progress = std::min(1.0, std::max(0.0, progress));
  return floor + (o.peak_lr - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

absl::StatusOr<double> GlobalNorm(const std::vector<at::Tensor>& grads) {
  return internal::CatchTorch([&]() -> absl::StatusOr<double> {
    double sq = 0;
    for (const at::Tensor& g : grads) {
      if (!g.defined()) continue;
      // norm() reduces without a temporary copy (cascade summation in the
      // tensor's dtype); the per-tensor norms are combined in float64.
      const double n = g.detach().norm().item<double>();
      sq += n * n;
    }
    return std::sqrt(sq);
  });
}

absl::StatusOr<double> ClipGradNorm(const std::vector<at::Tensor>& grads, double max_norm) {
  if (!(max_norm >= 0)) return absl::InvalidArgumentError("max_norm: must be >= 0");
  RLMESH_ASSIGN_OR_RETURN(double norm, GlobalNorm(grads));
  if (max_norm == 0 || !std::isfinite(norm)) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return norm;
  RLMESH_RETURN_IF_ERROR(internal::CatchTorch([&]() -> absl::Status {
    at::NoGradGuard no_grad;
    for (const at::Tensor& g : grads) {
      if (g.defined()) g.mul_(coef);
    }
    return absl::OkStatus();
  }));
  return norm;
}

}  // namespace rlmesh::learner
