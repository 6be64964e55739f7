#include "learner/schedule.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
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
    const double bias1 = 1.0 - std::pow(options.beta1, static_cast<double>(step));
    const double bias2 = 1.0 - std::pow(options.beta2, static_cast<double>(step));
    auto update = [&](at::Tensor p, const at::Tensor& g, at::Tensor m, at::Tensor v) {
      if (options.weight_decay != 0) p.mul_(1.0 - lr * options.weight_decay);
      m.mul_(options.beta1).add_(g, 1.0 - options.beta1);
      v.mul_(options.beta2).addcmul_(g, g, 1.0 - options.beta2);
      at::Tensor denom = (v.sqrt() / std::sqrt(bias2)).add_(options.eps);
      p.addcdiv_(m, denom, -lr / bias1);
    };
    if (!(param.is_contiguous() && grad.is_contiguous() && exp_avg.is_contiguous() && exp_avg_sq.is_contiguous())) {
      update(param, grad, exp_avg, exp_avg_sq);
      return absl::OkStatus();
    }
    // Contiguous (the flat buffers of DataParallel): the same element-wise
    // ops over cache-sized chunks. Each pass then reads memory that the
    // previous one left in cache; over a whole 50 MiB buffer every op
    // streams from DRAM and the update was ~2x slower (bench/learner.md).
    // 1 MiB chunks: 2^16 was as fast on 1 thread but 2x slower on 2 (each
    // op is an OpenMP region; more of them cost more wake-ups).
    constexpr int64_t kChunk = 1 << 18;  // elements (1 MiB of fp32)
    at::Tensor p = param.view({-1}), m = exp_avg.view({-1}), v = exp_avg_sq.view({-1});
    const at::Tensor g = grad.view({-1});
    const int64_t n = p.numel();
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      const int64_t len = std::min(kChunk, n - begin);
      update(p.narrow(0, begin, len), g.narrow(0, begin, len), m.narrow(0, begin, len), v.narrow(0, begin, len));
    }
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
    // norm() reduces in the tensor's dtype: over tens of millions of fp32
    // elements it drifts (0.2% low on a 13M-parameter model, ~1% at 2^24
    // elements). Chunks of 2^16 are summed in fp32 (accurate at that size,
    // no copy) and combined in float64.
    constexpr int64_t kChunk = 1 << 16;
    for (const at::Tensor& g : grads) {
      if (!g.defined()) continue;
      const at::Tensor flat = g.detach().reshape({-1});
      const int64_t n = flat.numel();
      for (int64_t begin = 0; begin < n; begin += kChunk) {
        const double c = flat.narrow(0, begin, std::min(kChunk, n - begin)).norm().item<double>();
        sq += c * c;
      }
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
