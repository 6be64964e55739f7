// DistillationAdvantages against hand-computed values.
#include "learner/distillation.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "catch2/catch.hpp"

namespace rlmesh::learner {
namespace {

TEST_CASE("distillation: A_t = coef * (teacher - old) on masked tokens, and the reverse-KL metrics") {
  // Row 0: two response tokens and a pad; row 1: one token.
  const at::Tensor teacher = at::tensor({-1.0f, -2.0f, -7.0f, -0.25f, 0.0f, 0.0f}).reshape({2, 3});
  const at::Tensor old = at::tensor({-1.5f, -1.0f, 0.0f, -0.25f, 0.0f, 0.0f}).reshape({2, 3});
  const at::Tensor mask = at::tensor({1.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f}).reshape({2, 3});
  auto d = DistillationAdvantages(teacher, old, mask, 2.0);
  REQUIRE(d.ok());
  // log r = teacher - old = 0.5, -1, (pad), 0.
  const at::Tensor want = at::tensor({1.0f, -2.0f, 0.0f, 0.0f, 0.0f, 0.0f}).reshape({2, 3});
  CHECK(at::allclose(d->advantages, want));
  CHECK(d->tokens == 3);
  // k1 = mean(old - teacher) = (-0.5 + 1 + 0) / 3.
  CHECK(d->metrics.at("distill_reverse_kl") == Approx(0.5 / 3).epsilon(1e-6));
  // k3 = mean(e^x - 1 - x), x = 0.5, -1, 0.
  const double k3 = ((std::exp(0.5) - 1.5) + (std::exp(-1.0) - 1 + 1) + 0.0) / 3;
  CHECK(d->metrics.at("distill_reverse_kl_k3") == Approx(k3).epsilon(1e-6));
  CHECK(d->metrics.at("distill_teacher_logp") == Approx((-1.0 - 2.0 - 0.25) / 3).epsilon(1e-6));
  CHECK_FALSE(d->advantages.requires_grad());
}

TEST_CASE("distillation: a teacher equal to the sampler gives zero advantages and zero KL") {
  const at::Tensor lp = at::tensor({-0.3f, -2.5f, -1.0f, -4.0f}).reshape({2, 2});
  auto d = DistillationAdvantages(lp, lp.clone(), at::ones({2, 2}), 1.0);
  REQUIRE(d.ok());
  CHECK(d->advantages.abs().max().item<float>() == 0.0f);
  CHECK(d->metrics.at("distill_reverse_kl") == 0.0);
  CHECK(d->metrics.at("distill_reverse_kl_k3") == 0.0);
}

TEST_CASE("distillation: bad inputs are refused by name; padding may hold anything") {
  const at::Tensor a = at::zeros({1, 2});
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(DistillationAdvantages(a, at::zeros({1, 3}), at::ones({1, 2}), 1.0).status().message().find("old_logp") !=
        std::string::npos);
  CHECK(DistillationAdvantages(a, a, at::ones({2, 2}), 1.0).status().message().find("mask") != std::string::npos);
  CHECK(DistillationAdvantages(a, a, at::ones({1, 2}), 0.0).status().message().find("coef") != std::string::npos);
  CHECK(DistillationAdvantages(a, a, at::ones({1, 2}), NAN).status().message().find("coef") != std::string::npos);
  const at::Tensor t = at::tensor({-inf, -1.0f}).reshape({1, 2});
  CHECK(DistillationAdvantages(t, a, at::ones({1, 2}), 1.0).status().message().find("teacher_logp") !=
        std::string::npos);
  // The same -inf at a padded position is ignored.
  auto ok = DistillationAdvantages(t, a, at::tensor({0.0f, 1.0f}).reshape({1, 2}), 1.0);
  REQUIRE(ok.ok());
  CHECK(ok->advantages[0][0].item<float>() == 0.0f);
  CHECK(ok->advantages[0][1].item<float>() == -1.0f);
  // An empty mask: no tokens, metrics 0.
  auto none = DistillationAdvantages(a, a, at::zeros({1, 2}), 1.0);
  REQUIRE(none.ok());
  CHECK(none->tokens == 0);
  CHECK(none->metrics.at("distill_reverse_kl") == 0.0);
}

}  // namespace
}  // namespace rlmesh::learner
