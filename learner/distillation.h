#pragma once

// On-policy distillation: the policy samples, a frozen teacher scores the
// sampled tokens, and the policy is pushed towards the teacher on its own
// samples. The per-token reverse KL between the sampler (pi_old) and the
// teacher, estimated on the sampled token y_t,
//   k1_t = log pi_old(y_t) - log pi_teacher(y_t),
// is a cost; its negation is each token's reward, and with no discount
// (each token answers for its own term only, the lower-variance choice of
// Thinking Machines' on-policy distillation) the token's advantage is
//   A_t = coef * (log pi_teacher(y_t) - log pi_old(y_t))      (mask = 1)
// and 0 elsewhere. Fed to the stage's policy loss, the on-policy gradient is
// -coef * E[sum_t k1_t * grad log pi(y_t)], which lowers the teacher's
// surprise at what the policy samples. A_t is added to the task reward's
// advantage when both are on.
//
// Plain functions on tensors; stateless, safe for concurrent use.

#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace rlmesh::learner {

struct DistillationOptions {
  // The teacher's model folder; empty = off.
  std::string teacher;
  // Weight of A_t; > 0.
  double coef = 1.0;
  // Keep the task reward's advantage beside A_t (else it is 0).
  bool task_reward = false;

  bool on() const { return !teacher.empty(); }
};

struct DistillationTerms {
  // A_t, [B, T] fp32, 0 where mask is 0.
  at::Tensor advantages;
  // Means over the masked tokens:
  //   distill_reverse_kl     k1 (above): unbiased, may be negative per batch;
  //   distill_reverse_kl_k3  (r - 1) - log r with r = pi_teacher/pi_old:
  //                          unbiased and never negative;
  //   distill_teacher_logp   the teacher's mean log-prob of the samples.
  // 0 when the mask is empty.
  std::map<std::string, double> metrics;
  // Masked tokens the means are over (to combine micro-batches).
  double tokens = 0;
};

// teacher_logp, old_logp, mask: [B, T] of one shape, finite where mask is
// set; coef > 0. INVALID_ARGUMENT names the offending input.
absl::StatusOr<DistillationTerms> DistillationAdvantages(const at::Tensor& teacher_logp,
                                                         const at::Tensor& old_logp, const at::Tensor& mask,
                                                         double coef);

}  // namespace rlmesh::learner
