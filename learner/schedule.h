#pragma once

// Optimizer pieces shared by every training stage: AdamW settings and its
// update on flat tensors (what data_parallel.h shards), the learning-rate
// schedule, and gradient clipping by global norm. Stateless functions; safe
// for concurrent use on distinct tensors.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlmesh::learner {

// AdamW exactly as torch.optim.AdamW (decoupled weight decay,
// bias-corrected moments, eps added after the square root).
struct AdamWOptions {
  // Exponential decay of the first moment. Default 0.9.
  double beta1 = 0.9;
  // Exponential decay of the second moment. Default 0.999.
  double beta2 = 0.999;
  // Added to sqrt(v_hat) in the denominator. Default 1e-8.
  double eps = 1e-8;
  // Decoupled weight decay per unit of learning rate: p *= 1 - lr * wd.
  // Default 0.
  double weight_decay = 0.0;

  absl::Status Validate() const;
};

// One AdamW step on `param` with gradient `grad` and moments `exp_avg`,
// `exp_avg_sq` (all the same shape and dtype; updated in place). `step` is
// the 1-based count of updates including this one (bias correction).
// Elementwise, so a slice of a flat buffer updates exactly as the same
// elements inside their own tensors would. REQUIRES: step >= 1, lr >= 0.
absl::Status AdamWUpdate(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                         at::Tensor& exp_avg_sq, int64_t step, double lr,
                         const AdamWOptions& options);

enum class LrDecay { kConstant, kCosine };

struct LrScheduleOptions {
  // Peak learning rate (after warmup). Must be > 0.
  double peak_lr = 1e-5;
  // Linear warmup length in optimizer steps; 0 = none. Default 0.
  int64_t warmup_steps = 0;
  // Total optimizer steps (the cosine reaches its floor here). Default 1.
  int64_t total_steps = 1;
  // After warmup: constant, or cosine down to the floor. Default constant.
  LrDecay decay = LrDecay::kConstant;
  // Cosine floor as a fraction of peak_lr, in [0, 1]. Default 0.
  double min_lr_ratio = 0.0;

  absl::Status Validate() const;
};

// Learning rate for the 0-based optimizer step `step`:
//   step < warmup:  peak * (step + 1) / warmup     (never 0 on the first step)
//   constant:       peak
//   cosine:         floor + (peak - floor) * (1 + cos(pi * p)) / 2,
//                   p = (step - warmup) / (total - warmup) clamped to [0, 1],
//                   floor = peak * min_lr_ratio.
// REQUIRES: options.Validate() is OK.
double LearningRate(const LrScheduleOptions& options, int64_t step);

// Scales the gradients in place so that their global L2 norm is at most
// `max_norm` (coefficient max_norm / (norm + 1e-6), as torch's
// clip_grad_norm_; applied only when < 1). Returns the norm before clipping
// (per-tensor norms combined in float64). Undefined tensors are skipped. A
// non-finite norm is returned as is and nothing is scaled: the caller should
// skip the step. max_norm = 0 only measures.
absl::StatusOr<double> ClipGradNorm(const std::vector<at::Tensor>& grads, double max_norm);

// The global L2 norm alone.
absl::StatusOr<double> GlobalNorm(const std::vector<at::Tensor>& grads);

}  // namespace rlmesh::learner
