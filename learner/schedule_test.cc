// LR schedule, gradient clipping and option validation.
#include "learner/schedule.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "catch2/catch.hpp"

namespace rlmesh::learner {
namespace {

TEST_CASE("linear warmup then cosine to a floor") {
  LrScheduleOptions o;
  o.peak_lr = 1.0;
  o.warmup_steps = 4;
  o.total_steps = 12;
  o.decay = LrDecay::kCosine;
  o.min_lr_ratio = 0.1;
  REQUIRE(o.Validate().ok());
  CHECK(LearningRate(o, 0) == Approx(0.25));  // (0 + 1) / 4: never 0
  CHECK(LearningRate(o, 3) == Approx(1.0));
  CHECK(LearningRate(o, 4) == Approx(1.0));   // cosine progress 0
  CHECK(LearningRate(o, 8) == Approx(0.55));  // progress .5: .1 + .9 * .5
  CHECK(LearningRate(o, 12) == Approx(0.1));
  CHECK(LearningRate(o, 100) == Approx(0.1));
  for (int s = 4; s < 12; ++s) CHECK(LearningRate(o, s + 1) < LearningRate(o, s));
  o.decay = LrDecay::kConstant;
  CHECK(LearningRate(o, 2) == Approx(0.75));
  CHECK(LearningRate(o, 100) == 1.0);
  o.warmup_steps = 0;
  CHECK(LearningRate(o, 0) == 1.0);
  o.min_lr_ratio = 2;
  CHECK(o.Validate().message().find("min_lr_ratio") != std::string::npos);
  LrScheduleOptions zero;
  zero.peak_lr = 0;
  CHECK(zero.Validate().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("clipping by global norm returns the pre-clip norm") {
  std::vector<at::Tensor> g = {at::tensor({3.0f, 0.0f}), at::tensor({0.0f, 4.0f}), at::Tensor()};
  auto norm = ClipGradNorm(g, 10.0);
  REQUIRE(norm.ok());
  CHECK(*norm == Approx(5.0));
  CHECK(g[0][0].item<float>() == 3.0f);  // below the limit: untouched
  norm = ClipGradNorm(g, 1.0);
  REQUIRE(norm.ok());
  CHECK(*norm == Approx(5.0));
  CHECK(g[0][0].item<float>() == Approx(0.6));
  CHECK(g[1][1].item<float>() == Approx(0.8));
  CHECK(*GlobalNorm(g) == Approx(1.0).epsilon(1e-5));
  // A non-finite norm is reported and nothing is scaled.
  std::vector<at::Tensor> bad = {at::tensor({std::numeric_limits<float>::infinity(), 1.0f})};
  auto inf = ClipGradNorm(bad, 1.0);
  REQUIRE(inf.ok());
  CHECK(std::isinf(*inf));
  CHECK(bad[0][1].item<float>() == 1.0f);
  CHECK(ClipGradNorm(g, -1).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the global norm of a large fp32 gradient is accurate (float64 reference)") {
  at::manual_seed(3);
  // 2^24 + 7 elements: where a plain fp32 reduction drifts by ~1%.
  at::Tensor g = at::rand({(1 << 24) + 7}, at::kFloat);
  const double want = g.to(at::kDouble).pow(2).sum().sqrt().item<double>();
  auto got = GlobalNorm({g});
  REQUIRE(got.ok());
  CHECK(std::abs(*got - want) / want < 1e-6);
}

TEST_CASE("AdamW over a large contiguous buffer (chunked) equals the whole-tensor ops bit for bit") {
  at::manual_seed(4);
  const int64_t n = 3 * (1 << 18) + 123;  // several chunks and a partial one
  at::Tensor p = at::randn({n}), g = at::randn({n}), m = at::randn({n}) * 0.1, v = at::rand({n}) * 0.01;
  at::Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
  AdamWOptions o;
  o.weight_decay = 0.01;
  REQUIRE(AdamWUpdate(p, g, m, v, 3, 1e-3, o).ok());
  // The reference: torch::optim::AdamW's sequence on whole tensors.
  const double bias1 = 1.0 - std::pow(o.beta1, 3.0), bias2 = 1.0 - std::pow(o.beta2, 3.0);
  p2.mul_(1.0 - 1e-3 * o.weight_decay);
  m2.mul_(o.beta1).add_(g, 1.0 - o.beta1);
  v2.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  at::Tensor denom = (v2.sqrt() / std::sqrt(bias2)).add_(o.eps);
  p2.addcdiv_(m2, denom, -1e-3 / bias1);
  CHECK(at::equal(p, p2));
  CHECK(at::equal(m, m2));
  CHECK(at::equal(v, v2));
}

TEST_CASE("AdamW: first step moves each weight by lr against the gradient sign") {
  // Step 1: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps).
  at::Tensor p = at::tensor({1.0f, 1.0f, 1.0f});
  at::Tensor g = at::tensor({0.5f, -2.0f, 0.0f});
  at::Tensor m = at::zeros({3}), v = at::zeros({3});
  AdamWOptions o;
  o.weight_decay = 0.1;
  REQUIRE(AdamWUpdate(p, g, m, v, 1, 0.01, o).ok());
  // Decay first: 1 * (1 - 0.01 * 0.1) = 0.999.
  CHECK(p[0].item<float>() == Approx(0.999 - 0.01));
  CHECK(p[1].item<float>() == Approx(0.999 + 0.01));
  CHECK(p[2].item<float>() == Approx(0.999));
  CHECK(AdamWUpdate(p, g, m, v, 0, 0.01, o).code() == absl::StatusCode::kInvalidArgument);
  o.beta1 = 1.0;
  CHECK(AdamWUpdate(p, g, m, v, 1, 0.01, o).message().find("beta1") != std::string::npos);
}

}  // namespace
}  // namespace rlmesh::learner
