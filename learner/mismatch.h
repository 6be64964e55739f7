#pragma once

// Rollout/learner mismatch correction: the weight that turns a loss on
// tokens sampled by the rollout worker (pi_rollout, its stored behaviour
// log-probs) into one for the learner's policy at the start of the step
// (pi_old). The two differ when the sample is stale (async RL) and, even
// on-policy, because the inference engine's numerics differ from the
// learner's (kernels, batch shapes, precision). Per token
//   w = pi_old / pi_rollout = exp(old_logp - behaviour_logp)
// or, at sequence level, one weight per row: the product of its tokens' w,
//   W_b = exp( sum_t m * (old_logp - behaviour_logp) ).
// Modes (x = w or W):
//   kNone    weight 1, nothing masked;
//   kTis     truncated IS: min(x, high) (high = 0: no truncation);
//   kMis     masked IS: x where x <= high, else masked out;
//   kIcePop  two-sided mask (IcePop): x where low <= x <= high, else masked.
// A masked token (every token of a masked row, at sequence level) leaves
// the loss: `keep` drops it from the mask, so it leaves the denominators of
// the loss aggregation too. Comparisons of a sequence weight are done on
// its log (no overflow).
//
// Plain functions on tensors; stateless, safe for concurrent use.

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "learner/losses.h"

namespace rlmesh::learner {

enum class MismatchMode { kNone, kTis, kMis, kIcePop };
enum class MismatchLevel { kToken, kSequence };

// "none", "tis", "mis", "icepop" / "token", "sequence"; else INVALID_ARGUMENT.
absl::StatusOr<MismatchMode> ParseMismatchMode(absl::string_view name);
absl::StatusOr<MismatchLevel> ParseMismatchLevel(absl::string_view name);

struct MismatchOptions {
  // Default kTis: with high = importance_cap, what PolicyLoss always did.
  MismatchMode mode = MismatchMode::kTis;
  // Default per token.
  MismatchLevel level = MismatchLevel::kToken;
  // Lower bound (kIcePop only; must be 0 otherwise), in (0, 1].
  double low = 0.0;
  // Upper bound: the truncation cap (kTis; 0 = none, token level only; a
  // cap below 1 is allowed, as importance_cap always allowed it) or the
  // masking threshold (kMis, kIcePop; >= 1). Default 2.
  double high = 2.0;

  absl::Status Validate() const;
};

struct MismatchWeights {
  // Weight per token, no grad; 0 off `keep`. [B, T] float.
  at::Tensor weight;
  // The mask with masked-out tokens removed. [B, T] bool.
  at::Tensor keep;
  // Stable names, token means over the input mask:
  //   mismatch_kl      KL(pi_rollout || pi_old) by the k3 estimator,
  //                    mean of (w - 1 - log w) (>= 0, 0 when equal);
  //   mismatch_k1      mean of (behaviour_logp - old_logp);
  //   mismatch_abs_diff  mean of |behaviour_logp - old_logp|, the
  //                    rollout/learner log-prob gap (a bf16 rollout's
  //                    numerics, a stale version);
  //   mismatch_masked_frac     fraction of tokens masked out;
  //   mismatch_truncated_frac  fraction whose weight was truncated (kTis);
  //   mismatch_weight_mean     mean weight over the kept tokens (1 if none).
  Metrics metrics;
};

// REQUIRES nothing; validates: old_logp, behaviour_logp and mask [B, T] of
// one shape (mask may be integral or bool).
absl::StatusOr<MismatchWeights> MismatchCorrection(const at::Tensor& old_logp, const at::Tensor& behaviour_logp,
                                                   const at::Tensor& mask, const MismatchOptions& options);

}  // namespace rlmesh::learner
