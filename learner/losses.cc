#include "learner/losses.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/full.h>
#include <ATen/ops/log_sigmoid.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <limits>

#include "common/status_macros.h"
#include "learner/device_metrics.h"
#include "learner/tensor_checks.h"

namespace rlmesh::learner {
namespace {

using internal::CatchTorch;
using internal::CheckSameShape;
using internal::CheckTensor;

// Zero where `on` is false. Through where(), the masked-out positions of `x`
// get an exactly-zero gradient even if they hold NaN or inf, which `x * m`
// would not give.
at::Tensor Keep(const at::Tensor& x, const at::Tensor& on) {
  return at::where(on, x, at::zeros({}, x.options()));
}

// Aggregation over validated inputs; `l` is already 0 where `on` is false.
at::Tensor Aggregate(const at::Tensor& l, const at::Tensor& on, LossAgg agg, double normalizer) {
  at::Tensor m = on.to(l.scalar_type());
  switch (agg) {
    case LossAgg::kTokenMean:
      return l.sum() / m.sum().clamp_min(1.0);
    case LossAgg::kSeqMeanTokenMean: {
      at::Tensor count = m.sum(1);
      at::Tensor per_row = l.sum(1) / count.clamp_min(1.0);
      at::Tensor rows = count.gt(0).to(l.scalar_type());
      return (per_row * rows).sum() / rows.sum().clamp_min(1.0);
    }
    case LossAgg::kSeqMeanTokenSum:
      return l.sum(1).mean();
    case LossAgg::kSeqMeanTokenSumNorm: {
      const double norm = normalizer > 0 ? normalizer : static_cast<double>(l.size(1));
      return l.sum() / (static_cast<double>(l.size(0)) * norm);
    }
  }
  return l.sum();  // Unreachable: every enumerator is handled above.
}

absl::Status CheckTokenTensor(const at::Tensor& t, const char* name, const at::Tensor& mask) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(t, name, 2));
  return CheckSameShape(mask, "mask", t, name);
}

absl::Status CheckOptionalTokenTensor(const at::Tensor& t, const char* name,
                                      const at::Tensor& mask) {
  if (!t.defined()) return absl::OkStatus();
  return CheckTokenTensor(t, name, mask);
}

absl::Status CheckPair(const at::Tensor& a, const char* a_name, const at::Tensor& b,
                       const char* b_name) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(a, a_name, 1));
  RLMESH_RETURN_IF_ERROR(CheckTensor(b, b_name, 1));
  RLMESH_RETURN_IF_ERROR(CheckSameShape(a, a_name, b, b_name));
  if (a.size(0) == 0) return absl::InvalidArgumentError(absl::StrCat(a_name, ": batch is empty"));
  return absl::OkStatus();
}

at::Tensor KlImpl(const at::Tensor& logp, const at::Tensor& ref_logp, KlEstimator estimator) {
  at::Tensor d = ref_logp - logp;
  switch (estimator) {
    case KlEstimator::kK1:
      return -d;
    case KlEstimator::kK2:
      return 0.5 * d * d;
    case KlEstimator::kK3:
      return at::exp(d) - d - 1.0;
  }
  return -d;  // Unreachable.
}

}  // namespace

absl::StatusOr<LossAgg> ParseLossAgg(absl::string_view name) {
  if (name == "token-mean") return LossAgg::kTokenMean;
  if (name == "seq-mean-token-mean") return LossAgg::kSeqMeanTokenMean;
  if (name == "seq-mean-token-sum") return LossAgg::kSeqMeanTokenSum;
  if (name == "seq-mean-token-sum-norm") return LossAgg::kSeqMeanTokenSumNorm;
  return absl::InvalidArgumentError(
      absl::StrCat("loss_agg: unknown mode \"", name,
                   "\" (token-mean, seq-mean-token-mean, seq-mean-token-sum, "
                   "seq-mean-token-sum-norm)"));
}

const char* LossAggName(LossAgg agg) {
  switch (agg) {
    case LossAgg::kTokenMean:
      return "token-mean";
    case LossAgg::kSeqMeanTokenMean:
      return "seq-mean-token-mean";
    case LossAgg::kSeqMeanTokenSum:
      return "seq-mean-token-sum";
    case LossAgg::kSeqMeanTokenSumNorm:
      return "seq-mean-token-sum-norm";
  }
  return "?";
}

absl::StatusOr<at::Tensor> AggregateLoss(const at::Tensor& per_token, const at::Tensor& mask,
                                         LossAgg agg, double normalizer) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(mask, "mask", 2, /*allow_integral=*/true));
  RLMESH_RETURN_IF_ERROR(CheckTokenTensor(per_token, "per_token", mask));
  if (!(normalizer >= 0)) return absl::InvalidArgumentError("normalizer: must be >= 0");
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    at::Tensor on = mask.ne(0);
    return Aggregate(Keep(per_token, on), on, agg, normalizer);
  });
}

absl::StatusOr<KlEstimator> ParseKlEstimator(absl::string_view name) {
  if (name == "k1") return KlEstimator::kK1;
  if (name == "k2") return KlEstimator::kK2;
  if (name == "k3") return KlEstimator::kK3;
  return absl::InvalidArgumentError(
      absl::StrCat("kl.estimator: unknown estimator \"", name, "\" (k1, k2, k3)"));
}

absl::StatusOr<at::Tensor> KlPenalty(const at::Tensor& logp, const at::Tensor& ref_logp,
                                     KlEstimator estimator) {
  if (!logp.defined() || !logp.is_floating_point()) {
    return absl::InvalidArgumentError("logp: expected a defined floating-point tensor");
  }
  if (!ref_logp.defined() || !ref_logp.is_floating_point()) {
    return absl::InvalidArgumentError("ref_logp: expected a defined floating-point tensor");
  }
  RLMESH_RETURN_IF_ERROR(CheckSameShape(logp, "logp", ref_logp, "ref_logp"));
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    return KlImpl(logp, ref_logp.detach(), estimator);
  });
}

absl::StatusOr<PolicyLossKind> ParsePolicyLoss(absl::string_view name) {
  if (name == "ppo") return PolicyLossKind::kPpo;
  if (name == "gspo") return PolicyLossKind::kGspo;
  if (name == "cispo") return PolicyLossKind::kCispo;
  return absl::InvalidArgumentError(
      absl::StrCat("policy_loss: unknown surrogate \"", name, "\" (ppo, gspo, cispo)"));
}

const char* PolicyLossName(PolicyLossKind kind) {
  switch (kind) {
    case PolicyLossKind::kPpo:
      return "ppo";
    case PolicyLossKind::kGspo:
      return "gspo";
    case PolicyLossKind::kCispo:
      return "cispo";
  }
  return "?";
}

absl::Status PolicyLossOptions::Validate() const {
  if (!(clip_low >= 0 && clip_low < 1)) {
    return absl::InvalidArgumentError("clip_low: must be in [0, 1)");
  }
  if (!(clip_high >= 0)) return absl::InvalidArgumentError("clip_high: must be >= 0");
  if (!(dual_clip == 0 || dual_clip > 1)) {
    return absl::InvalidArgumentError("dual_clip: must be 0 (off) or > 1");
  }
  if (kind == PolicyLossKind::kCispo && dual_clip != 0) {
    return absl::InvalidArgumentError("dual_clip: not used by policy_loss cispo (must be 0)");
  }
  if (!(importance_cap >= 0)) return absl::InvalidArgumentError("importance_cap: must be >= 0");
  if (!(kl_coef >= 0)) return absl::InvalidArgumentError("kl_coef: must be >= 0");
  if (!(entropy_coef >= 0)) return absl::InvalidArgumentError("entropy_coef: must be >= 0");
  if (!(agg_normalizer >= 0)) return absl::InvalidArgumentError("agg_normalizer: must be >= 0");
  return absl::OkStatus();
}

absl::StatusOr<LossOutput> PolicyLoss(const PolicyLossInputs& in,
                                      const PolicyLossOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  RLMESH_RETURN_IF_ERROR(CheckTensor(in.mask, "mask", 2, /*allow_integral=*/true));
  RLMESH_RETURN_IF_ERROR(CheckTokenTensor(in.logp, "logp", in.mask));
  RLMESH_RETURN_IF_ERROR(CheckTokenTensor(in.old_logp, "old_logp", in.mask));
  RLMESH_RETURN_IF_ERROR(CheckTokenTensor(in.advantages, "advantages", in.mask));
  RLMESH_RETURN_IF_ERROR(CheckOptionalTokenTensor(in.behaviour_logp, "behaviour_logp", in.mask));
  RLMESH_RETURN_IF_ERROR(CheckOptionalTokenTensor(in.is_weight, "is_weight", in.mask));
  RLMESH_RETURN_IF_ERROR(CheckOptionalTokenTensor(in.ref_logp, "ref_logp", in.mask));
  RLMESH_RETURN_IF_ERROR(CheckOptionalTokenTensor(in.entropy, "entropy", in.mask));
  if (options.kl_coef > 0 && !in.ref_logp.defined()) {
    return absl::InvalidArgumentError("ref_logp: required when kl_coef > 0");
  }
  if (options.entropy_coef > 0 && !in.entropy.defined()) {
    return absl::InvalidArgumentError("entropy: required when entropy_coef > 0");
  }
  return CatchTorch([&]() -> absl::StatusOr<LossOutput> {
    const at::Tensor on = in.mask.ne(0);
    const at::Tensor logp = Keep(in.logp, on);
    const at::Tensor old_logp = Keep(in.old_logp.detach(), on);
    const at::Tensor adv = Keep(in.advantages.detach(), on);
    LossOutput out;
    DeviceMetrics dm;

    at::Tensor ratio, pg, took_clip;
    at::Tensor dual_taken = at::zeros_like(on);
    if (options.kind == PolicyLossKind::kCispo) {
      // The clipped ratio only weights the REINFORCE term; no token loses
      // its gradient to the clip.
      ratio = at::exp(logp - old_logp).detach();
      at::Tensor clipped_ratio = ratio.clamp(1.0 - options.clip_low, 1.0 + options.clip_high);
      pg = -adv * clipped_ratio * logp;
      took_clip = ratio.lt(1.0 - options.clip_low).logical_or(ratio.gt(1.0 + options.clip_high)).logical_and(on);
    } else {
      if (options.kind == PolicyLossKind::kGspo) {
        // Mean log-ratio over each row's masked tokens (zero elsewhere:
        // logp and old_logp are both kept to 0 there).
        const at::Tensor m = on.to(logp.scalar_type());
        const at::Tensor seq_log_ratio =
            (logp - old_logp).sum(1, /*keepdim=*/true) / m.sum(1, /*keepdim=*/true).clamp_min(1.0);
        ratio = at::exp(seq_log_ratio.detach()) * at::exp(logp - logp.detach());
      } else {
        ratio = at::exp(logp - old_logp);
      }
      at::Tensor pg_unclipped = -adv * ratio;
      at::Tensor clipped_ratio = ratio.clamp(1.0 - options.clip_low, 1.0 + options.clip_high);
      at::Tensor pg_clipped = -adv * clipped_ratio;
      pg = at::maximum(pg_unclipped, pg_clipped);
      took_clip = pg_clipped.gt(pg_unclipped).logical_and(on);
    }
    if (options.dual_clip > 0) {
      at::Tensor cap = -adv * options.dual_clip;
      at::Tensor negative = adv.lt(0);
      dual_taken = negative.logical_and(pg.gt(cap)).logical_and(on);
      pg = at::where(negative, at::minimum(pg, cap), pg);
    }

    if (in.is_weight.defined()) {
      at::Tensor w = Keep(in.is_weight.detach(), on);
      pg = pg * w;
      dm.AddMaskedMean("is_weight_mean", w, on);
    } else if (in.behaviour_logp.defined()) {
      at::Tensor raw_w = at::exp(old_logp - Keep(in.behaviour_logp.detach(), on));
      at::Tensor w = options.importance_cap > 0 ? raw_w.clamp_max(options.importance_cap) : raw_w;
      pg = pg * w;
      dm.AddMaskedMean("is_weight_mean", w, on);
      if (options.importance_cap > 0) {
        dm.AddMaskedMean("is_capped_frac", raw_w.gt(options.importance_cap), on);
      } else {
        out.metrics["is_capped_frac"] = 0.0;
      }
    }

    at::Tensor pg_loss = Aggregate(Keep(pg, on), on, options.agg, options.agg_normalizer);
    at::Tensor loss = pg_loss;
    dm.Add("pg_loss", pg_loss);
    dm.AddMaskedMean("clip_frac", took_clip, on);
    dm.AddMaskedMean("clip_frac_high", took_clip.logical_and(ratio.gt(1.0)), on);
    dm.AddMaskedMean("clip_frac_low", took_clip.logical_and(ratio.lt(1.0)), on);
    dm.AddMaskedMean("dual_clip_frac", dual_taken, on);
    dm.AddMaskedMean("ratio_mean", ratio, on);
    const double inf = std::numeric_limits<double>::infinity();
    const at::Tensor any = on.any();
    const at::Tensor rd = ratio.detach().to(at::kDouble);
    const at::Tensor one = at::ones({}, rd.options());
    dm.Add("ratio_max", at::where(any, at::where(on, rd, at::full({}, -inf, rd.options())).max(), one));
    dm.Add("ratio_min", at::where(any, at::where(on, rd, at::full({}, inf, rd.options())).min(), one));
    dm.AddMaskedMean("ppo_kl", old_logp - logp, on);

    if (in.ref_logp.defined()) {
      at::Tensor kl = Keep(KlImpl(logp, Keep(in.ref_logp.detach(), on), options.kl_estimator), on);
      at::Tensor kl_agg = Aggregate(kl, on, options.agg, options.agg_normalizer);
      dm.Add("kl", kl_agg);
      if (options.kl_coef > 0) loss = loss + options.kl_coef * kl_agg;
    }
    if (in.entropy.defined()) {
      at::Tensor ent = Aggregate(Keep(in.entropy, on), on, options.agg, options.agg_normalizer);
      dm.Add("entropy", ent);
      if (options.entropy_coef > 0) loss = loss - options.entropy_coef * ent;
    }
    dm.Add("loss", loss);
    dm.ReadInto(&out.metrics);
    out.loss = loss;
    return out;
  });
}

absl::StatusOr<LossOutput> ValueLoss(const at::Tensor& values, const at::Tensor& old_values,
                                     const at::Tensor& returns, const at::Tensor& mask,
                                     double clip, LossAgg agg) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(mask, "mask", 2, /*allow_integral=*/true));
  RLMESH_RETURN_IF_ERROR(CheckTokenTensor(values, "values", mask));
  RLMESH_RETURN_IF_ERROR(CheckTokenTensor(old_values, "old_values", mask));
  RLMESH_RETURN_IF_ERROR(CheckTokenTensor(returns, "returns", mask));
  if (!(clip >= 0)) return absl::InvalidArgumentError("clip: must be >= 0");
  return CatchTorch([&]() -> absl::StatusOr<LossOutput> {
    const at::Tensor on = mask.ne(0);
    at::Tensor v = Keep(values, on);
    at::Tensor old_v = Keep(old_values.detach(), on);
    at::Tensor ret = Keep(returns.detach(), on);
    at::Tensor err = (v - ret).pow(2);
    at::Tensor l = err;
    LossOutput out;
    DeviceMetrics dm;
    if (clip > 0) {
      at::Tensor v_clip = old_v + (v - old_v).clamp(-clip, clip);
      at::Tensor err_clip = (v_clip - ret).pow(2);
      l = at::maximum(err, err_clip);
      dm.AddMaskedMean("vf_clip_frac", err_clip.gt(err), on);
    } else {
      out.metrics["vf_clip_frac"] = 0.0;
    }
    at::Tensor loss = Aggregate(Keep(0.5 * l, on), on, agg, 0.0);
    out.loss = loss;
    dm.Add("vf_loss", loss);
    dm.AddMaskedMean("value_mean", v, on);
    dm.AddMaskedMean("return_mean", ret, on);
    dm.ReadInto(&out.metrics);
    return out;
  });
}

absl::StatusOr<at::Tensor> EntropyFromLogits(const at::Tensor& logits) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(logits, "logits", 3));
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    at::Tensor lsm = at::log_softmax(logits.to(at::kFloat), -1);
    return -(at::exp(lsm) * lsm).sum(-1);
  });
}

absl::StatusOr<at::Tensor> TokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(logits, "logits", 3));
  RLMESH_RETURN_IF_ERROR(CheckTensor(tokens, "tokens", 2, /*allow_integral=*/true));
  if (tokens.is_floating_point() || tokens.scalar_type() == at::kBool) {
    return absl::InvalidArgumentError("tokens: expected an integer tensor");
  }
  if (tokens.size(0) != logits.size(0) || tokens.size(1) != logits.size(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: shape ", internal::ShapeString(tokens),
                     " does not match logits shape ", internal::ShapeString(logits)));
  }
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    if (tokens.numel() > 0) {
      const int64_t lo = tokens.min().item<int64_t>();
      const int64_t hi = tokens.max().item<int64_t>();
      if (lo < 0 || hi >= logits.size(2)) {
        return absl::InvalidArgumentError(absl::StrCat("tokens: ids must be in [0, ",
                                                       logits.size(2), "), got [", lo, ", ", hi,
                                                       "]"));
      }
    }
    at::Tensor lsm = at::log_softmax(logits.to(at::kFloat), -1);
    return lsm.gather(-1, tokens.to(at::kLong).unsqueeze(-1)).squeeze(-1);
  });
}

absl::StatusOr<at::Tensor> SequenceLogProbs(const at::Tensor& logp, const at::Tensor& mask) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(mask, "mask", 2, /*allow_integral=*/true));
  RLMESH_RETURN_IF_ERROR(CheckTokenTensor(logp, "logp", mask));
  return CatchTorch([&]() -> absl::StatusOr<at::Tensor> {
    return Keep(logp, mask.ne(0)).sum(1);
  });
}

absl::StatusOr<LossOutput> SftLoss(const at::Tensor& logp, const at::Tensor& mask, LossAgg agg) {
  RLMESH_RETURN_IF_ERROR(CheckTensor(mask, "mask", 2, /*allow_integral=*/true));
  RLMESH_RETURN_IF_ERROR(CheckTokenTensor(logp, "logp", mask));
  return CatchTorch([&]() -> absl::StatusOr<LossOutput> {
    const at::Tensor on = mask.ne(0);
    at::Tensor nll = Keep(-logp, on);
    LossOutput out;
    out.loss = Aggregate(nll, on, agg, 0.0);
    DeviceMetrics dm;
    dm.AddMaskedMean("ppl", nll, on);  // the token mean; exponentiated below
    dm.Add("sft_loss", out.loss);
    dm.Add("tokens", on.sum());
    dm.ReadInto(&out.metrics);
    out.metrics["ppl"] = std::exp(out.metrics["ppl"]);
    return out;
  });
}

absl::StatusOr<LossOutput> RewardModelLoss(const at::Tensor& chosen_scores,
                                           const at::Tensor& rejected_scores) {
  RLMESH_RETURN_IF_ERROR(CheckPair(chosen_scores, "chosen_scores", rejected_scores,
                                   "rejected_scores"));
  return CatchTorch([&]() -> absl::StatusOr<LossOutput> {
    at::Tensor d = chosen_scores - rejected_scores;
    LossOutput out;
    out.loss = -at::log_sigmoid(d).mean();
    at::Tensor dd = d.detach().to(at::kDouble);
    DeviceMetrics dm;
    dm.Add("rm_loss", out.loss);
    dm.Add("rm_accuracy", (dd.gt(0).to(at::kDouble) + 0.5 * dd.eq(0)).mean());
    dm.Add("rm_margin", dd.mean());
    dm.ReadInto(&out.metrics);
    return out;
  });
}

absl::StatusOr<LossOutput> DpoLoss(const DpoInputs& in, double beta) {
  if (!(beta > 0)) return absl::InvalidArgumentError("beta: must be > 0");
  RLMESH_RETURN_IF_ERROR(CheckPair(in.policy_chosen_logp, "policy_chosen_logp",
                                   in.policy_rejected_logp, "policy_rejected_logp"));
  RLMESH_RETURN_IF_ERROR(CheckPair(in.policy_chosen_logp, "policy_chosen_logp",
                                   in.ref_chosen_logp, "ref_chosen_logp"));
  RLMESH_RETURN_IF_ERROR(CheckPair(in.policy_chosen_logp, "policy_chosen_logp",
                                   in.ref_rejected_logp, "ref_rejected_logp"));
  return CatchTorch([&]() -> absl::StatusOr<LossOutput> {
    at::Tensor rc = beta * (in.policy_chosen_logp - in.ref_chosen_logp.detach());
    at::Tensor rr = beta * (in.policy_rejected_logp - in.ref_rejected_logp.detach());
    at::Tensor margin = rc - rr;
    LossOutput out;
    out.loss = -at::log_sigmoid(margin).mean();
    DeviceMetrics dm;
    dm.Add("dpo_loss", out.loss);
    dm.Add("reward_chosen", rc.mean());
    dm.Add("reward_rejected", rr.mean());
    dm.Add("reward_margin", margin.mean());
    dm.Add("reward_accuracy", margin.detach().gt(0).to(at::kDouble).mean());
    dm.ReadInto(&out.metrics);
    return out;
  });
}

}  // namespace rlmesh::learner
