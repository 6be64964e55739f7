#pragma once

// Advantage estimators for the RL stages, on plain tensors (no model).
//
// Shapes used throughout:
//   rewards  [G, n]  one scalar reward per sample, G groups (prompts) of n
//                    samples each, for the group-relative methods;
//   rewards  [B]     one scalar per sequence for REINFORCE++ and GAE;
//   mask     [B, T]  1 on response tokens the loss sees, 0 elsewhere (prompt,
//                    padding); any floating or bool dtype;
//   values, kl, ...  [B, T] per token.
// Results are float tensors on the input's device. Masked-out positions of a
// per-token result are exactly 0. Every function validates shapes and
// returns INVALID_ARGUMENT naming the argument; LibTorch errors come back as
// INTERNAL. Stateless; safe for concurrent use.

#include <ATen/core/Tensor.h>

#include <functional>

#include "absl/status/statusor.h"

namespace rlmesh::learner {

// GRPO: A_i = (r_i - mean(group)) / (std(group) + eps), std with Bessel's
// correction (n - 1), as verl and TRL compute it. With `scale_by_std` false
// this is Dr.GRPO: A_i = r_i - mean(group). Returns [G, n].
// REQUIRES: rewards is [G, n], n >= 2 when scale_by_std (the sample std of
// one value is undefined), eps >= 0.
absl::StatusOr<at::Tensor> GrpoAdvantages(const at::Tensor& rewards, bool scale_by_std = true,
                                          double eps = 1e-6);

// RLOO: A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean(group)),
// computed as the leave-one-out difference directly. Returns [G, n].
// REQUIRES: rewards is [G, n] with n >= 2.
absl::StatusOr<at::Tensor> RlooAdvantages(const at::Tensor& rewards);

// A token-level tensor from one value per sequence: out[b, t] =
// per_sequence[b] * mask[b, t]. per_sequence is [B] (or [G, n], flattened
// row-major to B = G*n).
absl::StatusOr<at::Tensor> ExpandToTokens(const at::Tensor& per_sequence, const at::Tensor& mask);

// Per-token rewards for the token-level estimators: the sequence reward sits
// on the last masked token of each row, and -kl_coef * kl[b, t] is added on
// every masked token (KL in the reward). `kl` may be undefined (no KL term).
// A row with no masked token gets no reward. Returns [B, T].
absl::StatusOr<at::Tensor> TokenRewards(const at::Tensor& rewards, const at::Tensor& mask,
                                        const at::Tensor& kl = at::Tensor(), double kl_coef = 0.0);

// Sums a small CPU float64 tensor over the data-parallel group, in place
// (every rank passes the same shape; a single process leaves it as is).
// Whitening takes it so that K shards whiten with the statistics of the
// global batch rather than of their own slice: with it, the K shards'
// advantages are exactly the slices of the K = 1 advantages.
using GlobalSum = std::function<absl::Status(at::Tensor&)>;

// Whitening over the masked tokens of the whole batch:
// (x - mean) / sqrt(var + eps) with mean and the Bessel-corrected variance
// taken over masked positions only; with `shift_mean` false the mean is added
// back (scale only). Masked-out positions are 0. With `global_sum`, mean and
// variance are over the masked tokens of every rank (two passes: the mean,
// then the squared deviations). REQUIRES: at least 2 masked tokens (over all
// ranks).
absl::StatusOr<at::Tensor> WhitenMasked(const at::Tensor& x, const at::Tensor& mask,
                                        bool shift_mean = true, double eps = 1e-8,
                                        const GlobalSum& global_sum = nullptr);

// REINFORCE++: per-token returns G_t = sum_{s >= t, masked} gamma^(k) r_s
// over TokenRewards(rewards, mask, kl, kl_coef) (k counts masked steps), then
// whitened over the batch's masked tokens. Returns [B, T].
absl::StatusOr<at::Tensor> ReinforcePlusPlusAdvantages(const at::Tensor& rewards,
                                                       const at::Tensor& mask,
                                                       const at::Tensor& kl = at::Tensor(),
                                                       double kl_coef = 0.0, double gamma = 1.0,
                                                       const GlobalSum& global_sum = nullptr);

struct GaeOptions {
  // Discount per token. Default 1.0.
  double gamma = 1.0;
  // GAE lambda. Default 0.95.
  double lam = 0.95;
  // Weight of the per-token KL penalty subtracted from the reward; 0 = none.
  double kl_coef = 0.0;
  // Whiten the advantages over the batch's masked tokens (returns are not
  // whitened). Default true.
  bool whiten = true;
  // Whiten over every data-parallel rank's tokens (see GlobalSum); null =
  // this batch only.
  GlobalSum global_sum;

  absl::Status Validate() const;
};

struct GaeResult {
  at::Tensor advantages;  // [B, T], 0 where masked out.
  at::Tensor returns;     // [B, T] = advantages (before whitening) + values.
};

// GAE for PPO. Token rewards are TokenRewards(rewards, mask, kl, kl_coef);
// walking backwards over masked tokens only (prompt and padding positions are
// skipped, so left padding and prompt tokens do not break the recursion):
//   delta_t = r_t + gamma * V_next - V_t,   A_t = delta_t + gamma*lam*A_next,
// with V_next = A_next = 0 after the last response token (terminal).
absl::StatusOr<GaeResult> GaeAdvantages(const at::Tensor& rewards, const at::Tensor& values,
                                        const at::Tensor& mask, const GaeOptions& options,
                                        const at::Tensor& kl = at::Tensor());

// DAPO overlong shaping. For a response of `length` tokens and the hard
// limit `max_length`, the penalty is
//   0                                         if length <= max_length - buffer
//   -penalty * (length - (max_length - buffer)) / buffer   otherwise,
// i.e. it falls linearly to -penalty at max_length (and keeps falling past
// it, as in DAPO). Add it to the reward. lengths is [B] (any numeric dtype);
// returns [B] float. REQUIRES: 0 < buffer <= max_length, penalty >= 0.
absl::StatusOr<at::Tensor> OverlongPenalty(const at::Tensor& lengths, int64_t max_length,
                                           int64_t buffer, double penalty);

// True for groups whose rewards are all equal within `tolerance` (max - min
// <= tolerance): their group-relative advantages are all 0 and carry no
// signal (DAPO drops them). rewards is [G, n]; returns bool [G].
absl::StatusOr<at::Tensor> ZeroVarianceGroups(const at::Tensor& rewards, double tolerance = 0.0);

}  // namespace rlmesh::learner
