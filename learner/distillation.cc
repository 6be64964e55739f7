#include "learner/distillation.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "learner/tensor_checks.h"

namespace rlmesh::learner {

using internal::CatchTorch;
using internal::CheckSameShape;
using internal::CheckTensor;

absl::StatusOr<DistillationTerms> DistillationAdvantages(const at::Tensor& teacher_logp,
                                                         const at::Tensor& old_logp, const at::Tensor& mask,
                                                         double coef) {
  if (auto st = CheckTensor(teacher_logp, "teacher_logp", 2); !st.ok()) return st;
  if (auto st = CheckTensor(old_logp, "old_logp", 2); !st.ok()) return st;
  if (auto st = CheckTensor(mask, "mask", 2, /*allow_integral=*/true); !st.ok()) return st;
  if (auto st = CheckSameShape(teacher_logp, "teacher_logp", old_logp, "old_logp"); !st.ok()) return st;
  if (auto st = CheckSameShape(teacher_logp, "teacher_logp", mask, "mask"); !st.ok()) return st;
  if (!(coef > 0) || !std::isfinite(coef)) {
    return absl::InvalidArgumentError(absl::StrCat("coef: must be finite and > 0, got ", coef));
  }
  return CatchTorch([&]() -> absl::StatusOr<DistillationTerms> {
    const at::Tensor m = mask.to(at::kFloat).ne(0).to(at::kFloat);
    const at::Tensor on = m.to(at::kBool);
    // Padding may hold anything (the log-prob of a pad target); only masked
    // positions must be finite.
    const at::Tensor t = at::where(on, teacher_logp.to(at::kFloat), at::zeros_like(m));
    const at::Tensor o = at::where(on, old_logp.to(at::kFloat), at::zeros_like(m));
    if (!at::isfinite(t).all().item<bool>()) {
      return absl::InvalidArgumentError("teacher_logp: not finite at a masked position");
    }
    if (!at::isfinite(o).all().item<bool>()) {
      return absl::InvalidArgumentError("old_logp: not finite at a masked position");
    }
    DistillationTerms out;
    const at::Tensor diff = (t - o) * m;  // log r, r = pi_teacher / pi_old
    out.advantages = (coef * diff).detach();
    out.tokens = m.sum().item<double>();
    const double n = out.tokens;
    out.metrics["distill_reverse_kl"] = n > 0 ? -diff.sum().item<double>() / n : 0.0;
    out.metrics["distill_reverse_kl_k3"] = n > 0 ? ((diff.exp() - 1 - diff) * m).sum().item<double>() / n : 0.0;
    out.metrics["distill_teacher_logp"] = n > 0 ? t.sum().item<double>() / n : 0.0;
    return out;
  });
}

}  // namespace rlmesh::learner
