// Losses against hand-worked cases (arithmetic in comments), their
// gradients, the on-policy identities, and toy objectives that must improve.
#include "learner/losses.h"

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "catch2/catch.hpp"
#include "learner/device_metrics.h"
#include "learner/mismatch.h"
#include "learner/schedule.h"

namespace rlmesh::learner {
namespace {

at::Tensor T1(std::vector<double> v) { return at::tensor(v, at::kDouble).to(at::kFloat); }
at::Tensor T2(std::vector<std::vector<double>> rows) {
  std::vector<at::Tensor> r;
  for (auto& row : rows) r.push_back(T1(row));
  return at::stack(r);
}
double Diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}
double Val(const at::Tensor& t) { return t.item<double>(); }

TEST_CASE("loss aggregation modes") {
  at::Tensor l = T2({{1, 2, 3, 4}, {5, 6, 0, 0}});
  at::Tensor m = T2({{1, 1, 1, 0}, {1, 0, 0, 0}});
  auto v = [&](LossAgg agg, double norm = 0) { return Val(AggregateLoss(l, m, agg, norm).value()); };
  CHECK(v(LossAgg::kTokenMean) == Approx(11.0 / 4));             // (1+2+3+5)/4
  CHECK(v(LossAgg::kSeqMeanTokenMean) == Approx((2.0 + 5) / 2));  // (6/3 + 5/1)/2
  CHECK(v(LossAgg::kSeqMeanTokenSum) == Approx((6.0 + 5) / 2));
  CHECK(v(LossAgg::kSeqMeanTokenSumNorm) == Approx(11.0 / (2 * 4)));  // T = 4
  CHECK(v(LossAgg::kSeqMeanTokenSumNorm, 10) == Approx(11.0 / 20));
  // NaN under the mask does not leak; an empty mask gives 0, not NaN.
  at::Tensor nan = l.clone();
  nan[0][3] = std::numeric_limits<float>::quiet_NaN();
  CHECK(Val(AggregateLoss(nan, m, LossAgg::kTokenMean).value()) == Approx(11.0 / 4));
  CHECK(Val(AggregateLoss(l, at::zeros_like(m), LossAgg::kSeqMeanTokenMean).value()) == 0.0);
  for (const char* name :
       {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}) {
    auto agg = ParseLossAgg(name);
    REQUIRE(agg.ok());
    CHECK(std::string(LossAggName(*agg)) == name);
  }
  auto bad = ParseLossAgg("token_mean");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("loss_agg") != std::string::npos);
}

TEST_CASE("KL estimators k1, k2, k3") {
  // logp = log .5, ref = log .25: d = ref - logp = log .5 = -0.693147.
  at::Tensor logp = T1({std::log(0.5)});
  at::Tensor ref = T1({std::log(0.25)});
  const double d = std::log(0.5);
  CHECK(Val(KlPenalty(logp, ref, KlEstimator::kK1).value()) == Approx(-d));
  CHECK(Val(KlPenalty(logp, ref, KlEstimator::kK2).value()) == Approx(0.5 * d * d));
  CHECK(Val(KlPenalty(logp, ref, KlEstimator::kK3).value()) == Approx(0.5 - d - 1));
  for (auto e : {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3}) {
    CHECK(Val(KlPenalty(logp, logp, e).value()) == 0.0);
  }
  CHECK(ParseKlEstimator("k3").value() == KlEstimator::kK3);
  CHECK(ParseKlEstimator("k4").status().code() == absl::StatusCode::kInvalidArgument);
}

// Four tokens, old_logp = 0 so the ratio is r = exp(logp):
//   a: A=+1, r=1.5  -> max(-1.5, -1.28) = -1.28   (clip-high 0.28 taken)
//   b: A=+1, r=0.5  -> max(-0.5, -0.8)  = -0.5    (unclipped)
//   c: A=-1, r=0.5  -> max(0.5, 0.8)    =  0.8    (clip-low 0.2 taken)
//   d: A=-1, r=4.0  -> max(4, 1.28) = 4 -> min(4, 3) = 3   (dual clip c=3)
struct Case {
  at::Tensor logp = T2({{std::log(1.5), std::log(0.5), std::log(0.5), std::log(4.0)}})
                        .requires_grad_(true);
  PolicyLossInputs in;
  PolicyLossOptions o;
  Case() {
    in.logp = logp;
    in.old_logp = at::zeros({1, 4});
    in.advantages = T2({{1, 1, -1, -1}});
    in.mask = at::ones({1, 4});
    o.clip_low = 0.2;
    o.clip_high = 0.28;
    o.dual_clip = 3.0;
  }
};

TEST_CASE("PPO surrogate: clip-higher, dual clip, metrics, gradient") {
  Case c;
  auto out = PolicyLoss(c.in, c.o);
  REQUIRE(out.ok());
  CHECK(Val(out->loss) == Approx((-1.28 - 0.5 + 0.8 + 3.0) / 4));
  CHECK(out->metrics.at("pg_loss") == Approx(0.505));
  CHECK(out->metrics.at("clip_frac") == 0.5);  // a and c
  CHECK(out->metrics.at("clip_frac_high") == 0.25);
  CHECK(out->metrics.at("clip_frac_low") == 0.25);
  CHECK(out->metrics.at("dual_clip_frac") == 0.25);
  CHECK(out->metrics.at("ratio_mean") == Approx(1.625));
  CHECK(out->metrics.at("ratio_max") == Approx(4.0));
  CHECK(out->metrics.at("ratio_min") == Approx(0.5));
  CHECK(out->metrics.count("kl") == 0);
  out->loss.backward();
  // Only b is unclipped: d/dlogp (-A r)/4 = -r/4 = -0.125; clipped tokens
  // (a, c) and the dual-clipped constant (d) carry no gradient.
  CHECK(Diff(c.logp.grad(), T2({{0, -0.125, 0, 0}})) < 1e-7);

  // Without dual clip, d costs its full 4.
  c.o.dual_clip = 0;
  CHECK(Val(PolicyLoss(c.in, c.o)->loss) == Approx((-1.28 - 0.5 + 0.8 + 4.0) / 4));
  // Symmetric clip 0.2: a becomes -1.2.
  c.o.clip_high = 0.2;
  CHECK(Val(PolicyLoss(c.in, c.o)->loss) == Approx((-1.2 - 0.5 + 0.8 + 4.0) / 4));
}

TEST_CASE("off-policy weight pi_old / pi_behaviour multiplies the surrogate, capped") {
  Case c;
  // behaviour = log [.5, 1, 1, 1] -> w = exp(0 - behaviour) = [2, 1, 1, 1],
  // capped at 1.5: pg = [-1.92, -0.5, 0.8, 3.0].
  c.in.behaviour_logp = T2({{std::log(0.5), 0, 0, 0}});
  c.o.importance_cap = 1.5;
  auto out = PolicyLoss(c.in, c.o);
  REQUIRE(out.ok());
  CHECK(Val(out->loss) == Approx((-1.92 - 0.5 + 0.8 + 3.0) / 4));
  CHECK(out->metrics.at("is_capped_frac") == 0.25);
  CHECK(out->metrics.at("is_weight_mean") == Approx((1.5 + 3) / 4));
  // Without the cap the full weight 2 applies.
  c.o.importance_cap = 0;
  CHECK(Val(PolicyLoss(c.in, c.o)->loss) == Approx((-2.56 - 0.5 + 0.8 + 3.0) / 4));
}

TEST_CASE("on-policy first step: ratio exactly 1, KL exactly 0") {
  at::Tensor logp = T2({{-0.3, -1.2, -2.0}, {-0.7, -0.1, -5.0}}).requires_grad_(true);
  PolicyLossInputs in;
  in.logp = logp;
  in.old_logp = logp.detach().clone();
  in.behaviour_logp = logp.detach().clone();
  in.ref_logp = logp.detach().clone();
  in.advantages = T2({{1, 1, 1}, {-2, -2, 0}});
  in.mask = T2({{1, 1, 1}, {1, 1, 0}});
  PolicyLossOptions o;
  o.kl_coef = 0.5;
  for (KlEstimator e : {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3}) {
    o.kl_estimator = e;
    auto out = PolicyLoss(in, o);
    REQUIRE(out.ok());
    CHECK(out->metrics.at("ratio_mean") == 1.0);
    CHECK(out->metrics.at("ratio_min") == 1.0);
    CHECK(out->metrics.at("ratio_max") == 1.0);
    CHECK(out->metrics.at("is_weight_mean") == 1.0);
    CHECK(out->metrics.at("kl") == 0.0);
    CHECK(out->metrics.at("clip_frac") == 0.0);
    CHECK(out->metrics.at("ppo_kl") == 0.0);
    // loss = -mean(A) over the 5 tokens = -(3 - 4)/5.
    CHECK(Val(out->loss) == Approx(0.2));
  }
  // The policy gradient at ratio 1 is -A / N per token (KL gradient is 0 at
  // pi = pi_ref for k2 and k3).
  o.kl_estimator = KlEstimator::kK3;
  auto out = PolicyLoss(in, o);
  out->loss.backward();
  CHECK(Diff(logp.grad(), T2({{-0.2, -0.2, -0.2}, {0.4, 0.4, 0}})) < 1e-7);
}

TEST_CASE("KL term and entropy bonus enter the loss with their coefficients") {
  PolicyLossInputs in;
  in.logp = T2({{std::log(0.5), std::log(0.5)}});
  in.old_logp = in.logp.clone();
  in.ref_logp = T2({{std::log(0.25), std::log(0.5)}});
  in.advantages = at::zeros({1, 2});
  in.mask = at::ones({1, 2});
  in.entropy = T2({{1.0, 3.0}});
  PolicyLossOptions o;
  o.kl_coef = 0.1;
  o.entropy_coef = 0.01;
  auto out = PolicyLoss(in, o);
  REQUIRE(out.ok());
  const double k3 = (0.5 - std::log(0.5) - 1) / 2;  // token 2 has KL 0
  CHECK(out->metrics.at("kl") == Approx(k3));
  CHECK(out->metrics.at("entropy") == Approx(2.0));
  CHECK(Val(out->loss) == Approx(0.1 * k3 - 0.01 * 2.0));
  in.ref_logp = at::Tensor();
  auto missing = PolicyLoss(in, o);
  CHECK(missing.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(missing.status().message().find("ref_logp") != std::string::npos);
}

TEST_CASE("policy loss: masked positions get no gradient even if NaN") {
  Case c;
  c.in.mask = T2({{1, 1, 0, 0}});
  at::Tensor logp = T2({{std::log(1.5), std::log(0.5), std::nan(""), INFINITY}}).requires_grad_(true);
  c.in.logp = logp;
  auto out = PolicyLoss(c.in, c.o);
  REQUIRE(out.ok());
  CHECK(Val(out->loss) == Approx((-1.28 - 0.5) / 2));
  out->loss.backward();
  CHECK(Diff(logp.grad(), T2({{0, -0.25, 0, 0}})) < 1e-7);
  CHECK(at::isfinite(logp.grad()).all().item<bool>());
}

TEST_CASE("policy loss validates its inputs") {
  Case c;
  c.in.advantages = at::zeros({1, 3});
  auto s = PolicyLoss(c.in, c.o).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("advantages") != std::string::npos);
  Case d;
  d.o.dual_clip = 0.5;
  CHECK(PolicyLoss(d.in, d.o).status().message().find("dual_clip") != std::string::npos);
  Case e;
  e.o.clip_low = 1.0;
  CHECK(PolicyLoss(e.in, e.o).status().code() == absl::StatusCode::kInvalidArgument);
}

// GSPO on two rows, old_logp = 0, clip 0.2 both sides:
//   row 0: mask [1 1 0], logp [ln 2, 0, .]: s0 = exp(ln 2 / 2) = sqrt 2 =
//          1.414214, A = +1 -> max(-1.414, -1.2) = -1.2 (clipped, whole row)
//   row 1: mask [1 1 1], logp [ln .9, 0, 0]: s1 = .9^(1/3) = 0.965489,
//          A = -1 -> max(.965489, .965489) = .965489 (inside the range)
// token-mean = (2 * -1.2 + 3 * .965489) / 5 = 0.0992935
// seq-mean-token-mean = (-1.2 + .965489) / 2 = -0.1172555
// Gradient (seq-mean-token-mean): row 0 none (clipped); each row-1 token
// -A * s1 / 3 / 2 = .965489 / 6 = 0.160915. Token-level PPO on the same
// inputs gives (-1.2 - 1 + .9 + 1 + 1) / 5 = 0.14 instead.
TEST_CASE("GSPO: sequence-level ratio and clipping") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  at::Tensor logp = T2({{std::log(2.0), 0, nan}, {std::log(0.9), 0, 0}}).requires_grad_(true);
  PolicyLossInputs in;
  in.logp = logp;
  in.old_logp = at::zeros({2, 3});
  in.advantages = T2({{1, 1, 1}, {-1, -1, -1}});
  in.mask = T2({{1, 1, 0}, {1, 1, 1}});
  PolicyLossOptions o;
  o.kind = PolicyLossKind::kGspo;
  auto out = PolicyLoss(in, o);
  REQUIRE(out.ok());
  const double s1 = std::cbrt(0.9);
  CHECK(Val(out->loss) == Approx((2 * -1.2 + 3 * s1) / 5));
  CHECK(out->metrics.at("clip_frac") == Approx(0.4));  // both row-0 tokens
  CHECK(out->metrics.at("ratio_mean") == Approx((2 * std::sqrt(2.0) + 3 * s1) / 5));
  o.agg = LossAgg::kSeqMeanTokenMean;
  out = PolicyLoss(in, o);
  REQUIRE(out.ok());
  CHECK(Val(out->loss) == Approx((-1.2 + s1) / 2));
  out->loss.backward();
  CHECK(Diff(logp.grad(), T2({{0, 0, 0}, {s1 / 6, s1 / 6, s1 / 6}})) < 1e-6);
  // The same inputs under token-level PPO.
  o.kind = PolicyLossKind::kPpo;
  o.agg = LossAgg::kTokenMean;
  CHECK(Val(PolicyLoss(in, o)->loss) == Approx(0.14));
}

// CISPO, old_logp = 0, clip_low 0.2, clip_high 0.28, r = [1.5, .5, .5, 1]:
//   w = clip(r) = [1.28, .8, .8, 1], A = [1, 1, -1, -1]
//   pg = -A * w * logp = [-1.28 ln 1.5, .8 ln 2, -.8 ln 2, 0]
//      = [-0.518995, 0.554518, -0.554518, 0]; mean = -0.129749
// Gradient -A * w / 4 = [-.32, -.2, .2, .25]: the clipped tokens (0, 1, 2)
// keep theirs, where PPO gives tokens 0 and 2 none.
TEST_CASE("CISPO: clipped stop-gradient weight times log-prob, gradient on every token") {
  at::Tensor logp = T2({{std::log(1.5), std::log(0.5), std::log(0.5), 0}}).requires_grad_(true);
  PolicyLossInputs in;
  in.logp = logp;
  in.old_logp = at::zeros({1, 4});
  in.advantages = T2({{1, 1, -1, -1}});
  in.mask = at::ones({1, 4});
  PolicyLossOptions o;
  o.kind = PolicyLossKind::kCispo;
  o.clip_low = 0.2;
  o.clip_high = 0.28;
  auto out = PolicyLoss(in, o);
  REQUIRE(out.ok());
  CHECK(Val(out->loss) == Approx((-1.28 * std::log(1.5)) / 4));
  CHECK(out->metrics.at("clip_frac") == Approx(0.75));
  out->loss.backward();
  CHECK(Diff(logp.grad(), T2({{-0.32, -0.2, 0.2, 0.25}})) < 1e-6);
  o.dual_clip = 3;
  auto refused = PolicyLoss(in, o);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.status().message().find("dual_clip") != std::string::npos);
  CHECK(ParsePolicyLoss("gspo").value() == PolicyLossKind::kGspo);
  CHECK(std::string(PolicyLossName(PolicyLossKind::kCispo)) == "cispo");
  CHECK(ParsePolicyLoss("grpo").status().message().find("policy_loss") != std::string::npos);
}

// Mismatch weights w = exp(old - behaviour), behaviour = 0 so old = ln w:
//   row 0 (mask 1 1 1): w = [3, .4, 1]; row 1 (mask 1 1 0): w = [1.5, .5, .]
// Row products: W0 = 1.2, W1 = .75.
struct MismatchCase {
  at::Tensor old_logp = T2({{std::log(3.0), std::log(0.4), 0}, {std::log(1.5), std::log(0.5), 7}});
  at::Tensor behaviour = T2({{0, 0, 0}, {0, 0, std::numeric_limits<double>::quiet_NaN()}});
  at::Tensor mask = T2({{1, 1, 1}, {1, 1, 0}});
  MismatchWeights Run(MismatchMode mode, MismatchLevel level, double low, double high) {
    MismatchOptions o;
    o.mode = mode;
    o.level = level;
    o.low = low;
    o.high = high;
    auto r = MismatchCorrection(old_logp, behaviour, mask, o);
    REQUIRE(r.ok());
    return *r;
  }
};

TEST_CASE("mismatch correction: token-level TIS, MIS, IcePop and the KL metrics") {
  MismatchCase c;
  auto tis = c.Run(MismatchMode::kTis, MismatchLevel::kToken, 0, 2);
  CHECK(Diff(tis.weight, T2({{2, 0.4, 1}, {1.5, 0.5, 0}})) < 1e-6);
  CHECK(tis.metrics.at("mismatch_truncated_frac") == Approx(0.2));
  CHECK(tis.metrics.at("mismatch_masked_frac") == 0.0);
  CHECK(tis.metrics.at("mismatch_weight_mean") == Approx(5.4 / 5));
  // k3: sum of w - 1 - ln w over the 5 tokens = .901388 + .316291 + 0 +
  // .094535 + .193147 = 1.505361; k1: -mean ln w = .105361 / 5.
  CHECK(tis.metrics.at("mismatch_kl") == Approx(1.505361 / 5).epsilon(1e-5));
  CHECK(tis.metrics.at("mismatch_k1") == Approx(0.105361 / 5).epsilon(1e-4));
  // The raw weights are 3, .4, 1, 1.5, .5: |ln w| sums to 3.113515.
  CHECK(tis.metrics.at("mismatch_abs_diff") == Approx(3.113515 / 5).epsilon(1e-5));

  auto mis = c.Run(MismatchMode::kMis, MismatchLevel::kToken, 0, 2);
  CHECK(Diff(mis.weight, T2({{0, 0.4, 1}, {1.5, 0.5, 0}})) < 1e-6);
  CHECK(Diff(mis.keep.to(at::kFloat), T2({{0, 1, 1}, {1, 1, 0}})) == 0);
  CHECK(mis.metrics.at("mismatch_masked_frac") == Approx(0.2));
  CHECK(mis.metrics.at("mismatch_weight_mean") == Approx(3.4 / 4));

  // IcePop [.5, 2]: 3 (above) and .4 (below) masked; .5 is on the bound.
  auto ice = c.Run(MismatchMode::kIcePop, MismatchLevel::kToken, 0.5, 2);
  CHECK(Diff(ice.weight, T2({{0, 0, 1}, {1.5, 0.5, 0}})) < 1e-6);
  CHECK(Diff(ice.keep.to(at::kFloat), T2({{0, 0, 1}, {1, 1, 0}})) == 0);
  CHECK(ice.metrics.at("mismatch_masked_frac") == Approx(0.4));

  auto none = c.Run(MismatchMode::kNone, MismatchLevel::kToken, 0, 2);
  CHECK(Diff(none.weight, T2({{1, 1, 1}, {1, 1, 0}})) == 0);
  CHECK(none.metrics.at("mismatch_kl") == Approx(1.505361 / 5).epsilon(1e-5));
}

TEST_CASE("mismatch correction: sequence level uses the product of token weights") {
  MismatchCase c;
  // TIS cap 1.1: W0 = 1.2 -> 1.1 on all of row 0; W1 = .75.
  auto tis = c.Run(MismatchMode::kTis, MismatchLevel::kSequence, 0, 1.1);
  CHECK(Diff(tis.weight, T2({{1.1, 1.1, 1.1}, {0.75, 0.75, 0}})) < 1e-6);
  CHECK(tis.metrics.at("mismatch_truncated_frac") == Approx(0.6));
  // IcePop [.8, 2]: row 1 (.75) masked, row 0 weighted 1.2.
  auto ice = c.Run(MismatchMode::kIcePop, MismatchLevel::kSequence, 0.8, 2);
  CHECK(Diff(ice.weight, T2({{1.2, 1.2, 1.2}, {0, 0, 0}})) < 1e-6);
  CHECK(ice.metrics.at("mismatch_masked_frac") == Approx(0.4));
  // MIS 1.1: row 0 (1.2) masked.
  auto mis = c.Run(MismatchMode::kMis, MismatchLevel::kSequence, 0, 1.1);
  CHECK(Diff(mis.weight, T2({{0, 0, 0}, {0.75, 0.75, 0}})) < 1e-6);
  CHECK(mis.metrics.at("mismatch_masked_frac") == Approx(0.6));
}

TEST_CASE("mismatch options are validated by name") {
  MismatchCase c;
  MismatchOptions o;
  o.low = 0.5;  // tis has no lower bound
  auto s = MismatchCorrection(c.old_logp, c.behaviour, c.mask, o).status();
  CHECK(s.message().find("mismatch.low") != std::string::npos);
  o = MismatchOptions();
  o.level = MismatchLevel::kSequence;
  o.high = 0;
  CHECK(MismatchCorrection(c.old_logp, c.behaviour, c.mask, o).status().message().find("mismatch.high") !=
        std::string::npos);
  o = MismatchOptions();
  o.mode = MismatchMode::kIcePop;  // low 0 is not in (0, 1]
  CHECK(MismatchCorrection(c.old_logp, c.behaviour, c.mask, o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ParseMismatchMode("icepop").value() == MismatchMode::kIcePop);
  CHECK(ParseMismatchMode("is").status().message().find("mismatch.mode") != std::string::npos);
  CHECK(ParseMismatchLevel("sequence").value() == MismatchLevel::kSequence);
}

TEST_CASE("token-level TIS weights reproduce the importance_cap loss bit for bit") {
  Case c;
  c.in.behaviour_logp = T2({{std::log(0.5), 0, -0.3, 0.2}});
  c.o.importance_cap = 1.5;
  auto before = PolicyLoss(c.in, c.o);
  REQUIRE(before.ok());
  MismatchOptions mo;
  mo.high = 1.5;
  auto w = MismatchCorrection(c.in.old_logp, c.in.behaviour_logp, c.in.mask, mo);
  REQUIRE(w.ok());
  PolicyLossInputs in = c.in;
  in.is_weight = w->weight;
  in.behaviour_logp = at::Tensor();
  auto after = PolicyLoss(in, c.o);
  REQUIRE(after.ok());
  CHECK(Val(after->loss) == Val(before->loss));
  CHECK(after->metrics.at("is_weight_mean") == before->metrics.at("is_weight_mean"));
}

TEST_CASE("clipped value loss") {
  // Token 0: v 1, old .5, R 0: err 1; v_clip .7 -> .49; max 1 -> .5.
  // Token 1: v 2.5, old 2, R 3: err .25; v_clip 2.2 -> .64; max .64 -> .32.
  at::Tensor v = T2({{1.0, 2.5, 8.0}}).requires_grad_(true);
  at::Tensor old = T2({{0.5, 2.0, 0.0}});
  at::Tensor ret = T2({{0.0, 3.0, 0.0}});
  at::Tensor m = T2({{1, 1, 0}});
  auto out = ValueLoss(v, old, ret, m, 0.2);
  REQUIRE(out.ok());
  CHECK(Val(out->loss) == Approx((0.5 + 0.32) / 2));
  CHECK(out->metrics.at("vf_clip_frac") == 0.5);
  out->loss.backward();
  // d/dv: token 0 unclipped branch: (v - R)/2 = .5; token 1 clipped branch
  // is constant in v: 0.
  CHECK(Diff(v.grad(), T2({{0.5, 0, 0}})) < 1e-7);
  auto plain = ValueLoss(v, old, ret, m, 0.0);
  CHECK(Val(plain->loss) == Approx((0.5 + 0.125) / 2));
  CHECK(ValueLoss(v, old, ret, m, -1).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("log-probs, entropy and sequence sums from logits") {
  at::Tensor logits = at::zeros({1, 2, 4});
  auto ent = EntropyFromLogits(logits);
  REQUIRE(ent.ok());
  CHECK(Diff(*ent, T2({{std::log(4.0), std::log(4.0)}})) < 1e-6);
  auto lp = TokenLogProbs(logits, at::tensor({1, 3}, at::kLong).view({1, 2}));
  REQUIRE(lp.ok());
  CHECK(Diff(*lp, T2({{std::log(0.25), std::log(0.25)}})) < 1e-6);
  CHECK(TokenLogProbs(logits, at::tensor({1, 4}, at::kLong).view({1, 2})).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto seq = SequenceLogProbs(T2({{-1, -2, -4}}), T2({{0, 1, 1}}));
  REQUIRE(seq.ok());
  CHECK(Val(*seq) == -6.0);
}

TEST_CASE("SFT masked cross-entropy") {
  // NLL .693147 and 1.386294: mean 1.039721; ppl = exp(mean) = sqrt(8).
  auto out = SftLoss(T2({{std::log(0.5), std::log(0.25), 5.0}}), T2({{1, 1, 0}}));
  REQUIRE(out.ok());
  CHECK(Val(out->loss) == Approx(-(std::log(0.5) + std::log(0.25)) / 2));
  CHECK(out->metrics.at("ppl") == Approx(std::sqrt(8.0)));
  CHECK(out->metrics.at("tokens") == 2.0);
}

TEST_CASE("Bradley-Terry reward-model loss and accuracy") {
  // d = [2, -1, 0]: loss = mean(log(1 + e^-d)); accuracy (1 + 0 + .5)/3.
  auto out = RewardModelLoss(T1({2, 0, 1}), T1({0, 1, 1}));
  REQUIRE(out.ok());
  const double want = (std::log1p(std::exp(-2.0)) + std::log1p(std::exp(1.0)) + std::log(2.0)) / 3;
  CHECK(Val(out->loss) == Approx(want));
  CHECK(out->metrics.at("rm_accuracy") == Approx(0.5));
  CHECK(out->metrics.at("rm_margin") == Approx(1.0 / 3));
  CHECK(RewardModelLoss(T1({1}), T1({1, 2})).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("DPO loss, implicit rewards and gradient") {
  // beta .1: rc = .1*[1, 0], rr = .1*[-1, 1], margin [.2, -.1].
  DpoInputs in;
  in.policy_chosen_logp = T1({-1, -2}).requires_grad_(true);
  in.policy_rejected_logp = T1({-3, -1});
  in.ref_chosen_logp = T1({-2, -2});
  in.ref_rejected_logp = T1({-2, -2});
  auto out = DpoLoss(in, 0.1);
  REQUIRE(out.ok());
  CHECK(Val(out->loss) == Approx((std::log1p(std::exp(-0.2)) + std::log1p(std::exp(0.1))) / 2));
  CHECK(out->metrics.at("reward_chosen") == Approx(0.05));
  CHECK(out->metrics.at("reward_rejected") == Approx(0.0).margin(1e-7));
  CHECK(out->metrics.at("reward_margin") == Approx(0.05));
  CHECK(out->metrics.at("reward_accuracy") == 0.5);
  out->loss.backward();
  // d/d pi_c = -beta * sigmoid(-margin) / B.
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  CHECK(Diff(in.policy_chosen_logp.grad(), T1({-0.1 * sig(-0.2) / 2, -0.1 * sig(0.1) / 2})) <
        1e-7);
  CHECK(DpoLoss(in, 0).status().message().find("beta") != std::string::npos);
}

// Toy objectives: a few AdamW steps on free logits must do what the loss is
// for.
void AdamSteps(at::Tensor& p, int steps, double lr,
               const std::function<at::Tensor(const at::Tensor&)>& loss) {
  at::Tensor m = at::zeros_like(p), v = at::zeros_like(p);
  for (int s = 1; s <= steps; ++s) {
    p.mutable_grad() = at::Tensor();
    loss(p).backward();
    at::Tensor data = p.detach();
    REQUIRE(AdamWUpdate(data, p.grad(), m, v, s, lr, AdamWOptions()).ok());
  }
}

TEST_CASE("toy objectives: SFT memorises, DPO raises the margin, RM ranks held-out pairs") {
  at::manual_seed(0);
  // SFT: 4 sequences of 6 tokens over a vocabulary of 5, free logits.
  at::Tensor tokens = at::randint(5, {4, 6}, at::kLong);
  at::Tensor mask = at::ones({4, 6});
  at::Tensor logits = at::zeros({4, 6, 5}).requires_grad_(true);
  auto sft = [&](const at::Tensor& p) {
    return SftLoss(TokenLogProbs(p, tokens).value(), mask).value().loss;
  };
  const double before = Val(sft(logits));
  AdamSteps(logits, 50, 0.1, sft);
  const double after = Val(sft(logits));
  CHECK(before == Approx(std::log(5.0)));
  CHECK(after < 0.05);

  // DPO: the chosen sequence's log-prob goes up relative to the rejected one.
  at::Tensor lg = at::zeros({2, 3, 4}).requires_grad_(true);  // [chosen, rejected]
  at::Tensor seqs = at::tensor({1, 2, 3, 3, 2, 1}, at::kLong).view({2, 3});
  at::Tensor ones = at::ones({2, 3});
  auto margin_and_loss = [&](const at::Tensor& p) {
    at::Tensor s = SequenceLogProbs(TokenLogProbs(p, seqs).value(), ones).value();
    DpoInputs in;
    in.policy_chosen_logp = s.narrow(0, 0, 1);
    in.policy_rejected_logp = s.narrow(0, 1, 1);
    in.ref_chosen_logp = T1({3 * std::log(0.25)});
    in.ref_rejected_logp = T1({3 * std::log(0.25)});
    return DpoLoss(in, 0.1).value();
  };
  const double m0 = margin_and_loss(lg).metrics.at("reward_margin");
  AdamSteps(lg, 20, 0.05, [&](const at::Tensor& p) { return margin_and_loss(p).loss; });
  const double m1 = margin_and_loss(lg).metrics.at("reward_margin");
  CHECK(m0 == Approx(0.0).margin(1e-9));
  CHECK(m1 > 0.2);

  // RM: a linear scorer on 4 features; preference = higher feature-0.
  at::Tensor w = at::zeros({4}).requires_grad_(true);
  auto pairs = [](int n) {
    at::Tensor a = at::randn({n, 4}), b = at::randn({n, 4});
    at::Tensor a_wins = a.select(1, 0).gt(b.select(1, 0)).unsqueeze(1);
    return std::make_pair(at::where(a_wins, a, b), at::where(a_wins, b, a));
  };
  auto [train_c, train_r] = pairs(64);
  auto [test_c, test_r] = pairs(64);
  auto rm = [&](const at::Tensor& p, const at::Tensor& c, const at::Tensor& r) {
    return RewardModelLoss(at::mv(c, p), at::mv(r, p)).value();
  };
  CHECK(rm(w, test_c, test_r).metrics.at("rm_accuracy") == 0.5);  // all ties
  AdamSteps(w, 30, 0.1, [&, c = train_c, r = train_r](const at::Tensor& p) { return rm(p, c, r).loss; });
  CHECK(rm(w, test_c, test_r).metrics.at("rm_accuracy") > 0.9);
}

}  // namespace
}  // namespace rlmesh::learner

namespace rlmesh::learner {
namespace {

// Every metric of a loss call comes back in one copy to the host, with the
// values one .item() each would give.
TEST_CASE("DeviceMetrics: one read for all the values, equal to reading each") {
  at::manual_seed(3);
  const at::Tensor x = at::randn({4, 5});
  const at::Tensor on = at::rand({4, 5}).gt(0.4);
  DeviceMetrics dm;
  dm.Add("sum", x.sum());
  dm.Add("count", on.sum());
  dm.AddMaskedMean("mean", x, on);
  dm.AddMaskedMean("none", x, at::zeros({4, 5}, at::kBool), 7.0);
  Metrics got;
  dm.ReadInto(&got);
  CHECK(dm.reads() == 1);
  CHECK(got.at("sum") == x.sum().to(at::kDouble).item<double>());
  CHECK(got.at("count") == static_cast<double>(on.sum().item<int64_t>()));
  const double n = on.sum().to(at::kDouble).item<double>();
  CHECK(got.at("mean") == at::where(on, x.to(at::kDouble), 0.0).sum().item<double>() / n);
  CHECK(got.at("none") == 7.0);
  dm.ReadInto(&got);  // nothing left to read: no copy
  CHECK(dm.reads() == 1);

  // The policy loss reports its metrics through it, the empty-mask
  // defaults included.
  PolicyLossInputs in;
  in.mask = on;
  in.logp = at::randn({4, 5}) * 0.1 - 1;
  in.old_logp = in.logp + at::randn({4, 5}) * 0.05;
  in.advantages = at::randn({4, 5});
  in.behaviour_logp = in.old_logp + at::randn({4, 5}) * 0.05;
  auto loss = PolicyLoss(in, PolicyLossOptions());
  REQUIRE(loss.ok());
  CHECK(loss->metrics.size() >= 12);
  CHECK(loss->metrics.at("ratio_max") >= loss->metrics.at("ratio_min"));
  in.mask = at::zeros({4, 5}, at::kBool);
  auto empty = PolicyLoss(in, PolicyLossOptions());
  REQUIRE(empty.ok());
  CHECK(empty->metrics.at("ratio_max") == 1.0);
  CHECK(empty->metrics.at("ratio_min") == 1.0);
  CHECK(empty->metrics.at("clip_frac") == 0.0);
}

}  // namespace
}  // namespace rlmesh::learner
