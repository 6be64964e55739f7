#pragma once

// Training losses on plain tensors (no model): the PPO/GRPO policy loss with
// its DAPO and off-policy pieces, KL estimators, entropy, the clipped value
// loss, SFT, Bradley-Terry reward-model loss and DPO.
//
// Conventions:
//   - log-prob tensors are log pi(token) of the *taken* token, [B, T]
//     (per token) or [B] (per sequence, e.g. summed over the response);
//   - mask is [B, T], nonzero = the token counts (response tokens); masked-out
//     positions never contribute, whatever their values (NaN included);
//   - `loss` is a 0-dim tensor that carries autograd to the inputs that
//     require grad; `metrics` are plain doubles computed without grad, with
//     the stable names listed at each function.
// Every function validates shapes and returns INVALID_ARGUMENT naming the
// argument; LibTorch errors come back as INTERNAL. Stateless; safe for
// concurrent use.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlmesh::learner {

using Metrics = std::map<std::string, double>;

struct LossOutput {
  at::Tensor loss;  // 0-dim, differentiable.
  Metrics metrics;
};

// How per-token losses l[b, t] become one scalar (m = mask):
//   kTokenMean           sum(l*m) / sum(m)                (DAPO token-level)
//   kSeqMeanTokenMean    mean_b( sum_t(l*m) / sum_t(m) )  (GRPO paper; rows
//                        with no masked token are left out of the mean)
//   kSeqMeanTokenSum     mean_b( sum_t(l*m) )
//   kSeqMeanTokenSumNorm sum(l*m) / (B * normalizer)      (Dr.GRPO: a constant
//                        normaliser, default the padded length T, so that no
//                        length bias enters)
enum class LossAgg { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSum, kSeqMeanTokenSumNorm };

// "token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
// "seq-mean-token-sum-norm"; anything else is INVALID_ARGUMENT.
absl::StatusOr<LossAgg> ParseLossAgg(absl::string_view name);
const char* LossAggName(LossAgg agg);

// Aggregates per-token values as described at LossAgg. `normalizer` is used
// by kSeqMeanTokenSumNorm only (0 = T). An all-zero mask gives 0 (not NaN).
absl::StatusOr<at::Tensor> AggregateLoss(const at::Tensor& per_token, const at::Tensor& mask,
                                         LossAgg agg, double normalizer = 0.0);

enum class KlEstimator { kK1, kK2, kK3 };

// "k1", "k2", "k3".
absl::StatusOr<KlEstimator> ParseKlEstimator(absl::string_view name);

// Per-token KL(pi || pi_ref) estimate from log-probs of tokens sampled from
// pi. With d = ref_logp - logp:
//   k1 = -d                 (unbiased, can be negative)
//   k2 = d^2 / 2            (biased, low variance)
//   k3 = exp(d) - d - 1     (unbiased, >= 0; Schulman's estimator)
// All three are exactly 0 where logp == ref_logp. Same shape as the inputs.
absl::StatusOr<at::Tensor> KlPenalty(const at::Tensor& logp, const at::Tensor& ref_logp,
                                     KlEstimator estimator);

// The surrogate PolicyLoss computes (rl.policy_loss).
enum class PolicyLossKind { kPpo, kGspo, kCispo };

// "ppo", "gspo", "cispo"; anything else is INVALID_ARGUMENT.
absl::StatusOr<PolicyLossKind> ParsePolicyLoss(absl::string_view name);
const char* PolicyLossName(PolicyLossKind kind);

struct PolicyLossOptions {
  // Which surrogate (see PolicyLoss). Default ppo.
  PolicyLossKind kind = PolicyLossKind::kPpo;
  // Lower clip: the ratio is clipped below at 1 - clip_low. Default 0.2.
  double clip_low = 0.2;
  // Upper clip: above at 1 + clip_high (DAPO clip-higher uses 0.28).
  // Default 0.2.
  double clip_high = 0.2;
  // Dual-clip constant c > 1: for negative advantages the loss is capped at
  // -A * c. 0 disables. Default 0.
  double dual_clip = 0.0;
  // Cap on the off-policy weight pi_old/pi_behaviour (truncated importance
  // sampling); 0 = no truncation. Default 2.
  double importance_cap = 2.0;
  // Coefficient of the KL-to-reference loss term; 0 = none. Default 0.
  double kl_coef = 0.0;
  // Estimator for that term. Default k3.
  KlEstimator kl_estimator = KlEstimator::kK3;
  // Entropy bonus coefficient (subtracted from the loss). Default 0.
  double entropy_coef = 0.0;
  // Aggregation of every per-token term. Default token-mean.
  LossAgg agg = LossAgg::kTokenMean;
  // Constant normaliser for kSeqMeanTokenSumNorm (0 = T). Default 0.
  double agg_normalizer = 0.0;

  absl::Status Validate() const;
};

struct PolicyLossInputs {
  // log pi_theta(token), the policy being trained; requires grad. [B, T]
  at::Tensor logp;
  // log pi_old(token): the learner's policy at the start of this step,
  // recomputed (no grad). [B, T]
  at::Tensor old_logp;
  // Per-token advantages. [B, T]
  at::Tensor advantages;
  // Response mask. [B, T]
  at::Tensor mask;
  // Optional: log pi_behaviour(token) stored by the rollout worker that
  // sampled the token (possibly an older policy version). [B, T]
  at::Tensor behaviour_logp;
  // Optional: a precomputed importance weight per token (no grad), e.g. from
  // MismatchCorrection (learner/mismatch.h). When given it replaces the
  // weight PolicyLoss would compute from behaviour_logp (which is then not
  // read). [B, T]
  at::Tensor is_weight;
  // Optional (required when kl_coef > 0): log pi_ref(token). [B, T]
  at::Tensor ref_logp;
  // Optional (required when entropy_coef > 0): per-token entropy of pi_theta,
  // differentiable. [B, T]
  at::Tensor entropy;
};

// The policy-gradient surrogate with clip-higher, dual clip, off-policy
// correction, KL term and entropy bonus. kind = kPpo (the PPO clipped
// surrogate), per token, with A the advantage:
//   r  = exp(logp - old_logp)                      PPO ratio (carries grad)
//   w  = min(exp(old_logp - behaviour_logp), cap)  off-policy weight, no grad
//                                                  (w = 1 without behaviour_logp)
//   pg = max(-A*r, -A*clip(r, 1-clip_low, 1+clip_high))
//   pg = min(pg, -A*dual_clip)   where A < 0, if dual_clip > 0
//   l  = w * pg
// i.e. the decoupled PPO objective: trust region around pi_old, importance
// weight pi_old/pi_behaviour correcting for the sampling policy; the product
// w*r equals pi_theta/pi_behaviour where nothing is clipped. On-policy
// (behaviour == old == theta) r = w = 1 exactly. `is_weight`, when given,
// is w (and behaviour_logp is not read).
// kind = kGspo (GSPO, in its token form): r is replaced on every token of
// row b by the sequence ratio
//   s_b = exp( sum_t m*(logp - old_logp) / sum_t m )
// whose value is the same on all the row's tokens and whose gradient on
// token t is s_b * grad logp_t (r_t = sg(s_b) * exp(logp_t - sg(logp_t)));
// clipping and dual clip then act on s_b, so a whole sequence is clipped
// or not. With seq-mean-token-mean aggregation this is the paper's
// objective and gradient exactly (with equal advantages over a row).
// kind = kCispo (CISPO): the clipped ratio is a weight without gradient,
//   pg = -A * sg(clip(r, 1-clip_low, 1+clip_high)) * logp
// so every token keeps the REINFORCE gradient, scaled; dual_clip must be 0.
// clip_frac counts the tokens whose r lies outside the clip range.
//   loss = agg(l) + kl_coef * agg(k(logp, ref_logp)) - entropy_coef * agg(entropy)
// Metrics: loss, pg_loss, clip_frac (tokens where the clipped term was taken,
// either side), clip_frac_high, clip_frac_low, dual_clip_frac, ratio_mean,
// ratio_min, ratio_max, ppo_kl (mean of old_logp - logp), is_weight_mean,
// is_capped_frac (only with behaviour_logp and no is_weight), kl (only with ref_logp), entropy
// (only with entropy). Token means over the mask, except pg_loss, kl and
// entropy which use `agg`.
absl::StatusOr<LossOutput> PolicyLoss(const PolicyLossInputs& in,
                                      const PolicyLossOptions& options);

// Clipped value loss (PPO):
//   v_clip = old_values + clamp(values - old_values, -clip, clip)
//   l = 0.5 * max((values - returns)^2, (v_clip - returns)^2)
// (clip = 0: l = 0.5 * (values - returns)^2). All [B, T].
// Metrics: vf_loss, vf_clip_frac, value_mean, return_mean.
absl::StatusOr<LossOutput> ValueLoss(const at::Tensor& values, const at::Tensor& old_values,
                                     const at::Tensor& returns, const at::Tensor& mask,
                                     double clip, LossAgg agg = LossAgg::kTokenMean);

// Per-token entropy of softmax(logits) over the last dimension: [B, T, V] ->
// [B, T], differentiable.
absl::StatusOr<at::Tensor> EntropyFromLogits(const at::Tensor& logits);

// log softmax(logits)[token]: logits [B, T, V], tokens [B, T] integral ->
// [B, T], differentiable.
absl::StatusOr<at::Tensor> TokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens);

// Sum of per-token log-probs over the mask: [B, T] -> [B].
absl::StatusOr<at::Tensor> SequenceLogProbs(const at::Tensor& logp, const at::Tensor& mask);

// SFT / continued pre-training: masked negative log-likelihood,
// loss = agg(-logp). Use an all-ones mask for raw text.
// Metrics: sft_loss, ppl (exp of the token-mean NLL), tokens.
absl::StatusOr<LossOutput> SftLoss(const at::Tensor& logp, const at::Tensor& mask,
                                   LossAgg agg = LossAgg::kTokenMean);

// Bradley-Terry reward-model loss on pairs: mean(-log sigmoid(s_c - s_r)).
// chosen/rejected scores are [B]. Metrics: rm_loss, rm_accuracy (fraction
// with s_c > s_r; a tie counts 1/2), rm_margin (mean s_c - s_r).
absl::StatusOr<LossOutput> RewardModelLoss(const at::Tensor& chosen_scores,
                                           const at::Tensor& rejected_scores);

struct DpoInputs {
  // Sequence log-probs (summed over the response) under the policy; [B],
  // differentiable.
  at::Tensor policy_chosen_logp;
  at::Tensor policy_rejected_logp;
  // The same under the frozen reference (computed once); [B].
  at::Tensor ref_chosen_logp;
  at::Tensor ref_rejected_logp;
};

// DPO: with implicit rewards rc = beta*(pi_c - ref_c), rr = beta*(pi_r - ref_r),
// loss = mean(-log sigmoid(rc - rr)). REQUIRES: beta > 0.
// Metrics: dpo_loss, reward_chosen, reward_rejected, reward_margin (means of
// rc, rr, rc - rr) and reward_accuracy (fraction with rc > rr).
absl::StatusOr<LossOutput> DpoLoss(const DpoInputs& in, double beta);

}  // namespace rlmesh::learner
