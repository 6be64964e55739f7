// Advantage estimators against hand-worked cases (arithmetic in comments).
#include "learner/advantages.h"

#include <ATen/ATen.h>

#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"

namespace rlmesh::learner {
namespace {

at::Tensor T1(std::vector<double> v) { return at::tensor(v, at::kDouble).to(at::kFloat); }
at::Tensor T2(std::vector<std::vector<double>> rows) {
  std::vector<at::Tensor> r;
  for (auto& row : rows) r.push_back(T1(row));
  return at::stack(r);
}
// Max |a - b| between a result and the expected values.
double Diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST_CASE("GRPO normalises by group mean and sample std; Dr.GRPO only centres") {
  at::Tensor r = T2({{1, 0, 0, 1}, {2, 2, 2, 2}});
  // Group 0: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.577350 -> +-0.866025.
  // Group 1: all equal -> 0 / (0 + eps) = 0.
  auto a = GrpoAdvantages(r);
  REQUIRE(a.ok());
  CHECK(Diff(*a, T2({{0.866025, -0.866025, -0.866025, 0.866025}, {0, 0, 0, 0}})) < 1e-5);
  auto dr = GrpoAdvantages(r, /*scale_by_std=*/false);
  REQUIRE(dr.ok());
  CHECK(Diff(*dr, T2({{0.5, -0.5, -0.5, 0.5}, {0, 0, 0, 0}})) < 1e-7);
}

TEST_CASE("RLOO subtracts the mean of the other samples") {
  // 3 - (1+2)/2 = 1.5, 1 - (3+2)/2 = -1.5, 2 - (3+1)/2 = 0.
  // 1 - (0+0+1)/3 = 2/3, 0 - (1+0+1)/3 = -2/3.
  auto a = RlooAdvantages(T2({{3, 1, 2, 2}, {1, 0, 0, 1}}));
  REQUIRE(a.ok());
  auto b = RlooAdvantages(T2({{3, 1, 2}}));
  REQUIRE(b.ok());
  CHECK(Diff(*b, T2({{1.5, -1.5, 0}})) < 1e-6);
  CHECK(Diff(a->select(0, 1), T1({2.0 / 3, -2.0 / 3, -2.0 / 3, 2.0 / 3})) < 1e-6);
}

TEST_CASE("group estimators reject groups they cannot handle") {
  auto one = GrpoAdvantages(T2({{1}, {2}}));
  CHECK(one.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(one.status().message().find("rewards") != std::string::npos);
  CHECK(GrpoAdvantages(T2({{1}, {2}}), false).ok());  // Dr.GRPO needs no std.
  CHECK(RlooAdvantages(T2({{1}})).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(GrpoAdvantages(T1({1, 2})).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(GrpoAdvantages(at::Tensor()).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("token rewards sit on the last response token, KL on every token") {
  at::Tensor mask = T2({{0, 1, 1, 0}, {1, 1, 1, 1}, {0, 0, 0, 0}});
  auto r = TokenRewards(T1({1, 2, 5}), mask);
  REQUIRE(r.ok());
  CHECK(Diff(*r, T2({{0, 0, 1, 0}, {0, 0, 0, 2}, {0, 0, 0, 0}})) == 0);
  at::Tensor kl = T2({{.1, .2, .3, .4}, {0, .2, 0, .2}, {1, 1, 1, 1}});
  auto rk = TokenRewards(T1({1, 2, 5}), mask, kl, 0.5);
  REQUIRE(rk.ok());
  // Row 0: [0, -0.1, 1 - 0.15, 0]; row 1: [0, -0.1, 0, 2 - 0.1].
  CHECK(Diff(*rk, T2({{0, -0.1, 0.85, 0}, {0, -0.1, 0, 1.9}, {0, 0, 0, 0}})) < 1e-6);
  CHECK(TokenRewards(T1({1}), mask).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(TokenRewards(T1({1, 2, 5}), mask, at::Tensor(), 0.5).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("GAE: hand-worked recursion, prompt and padding skipped") {
  // gamma 0.9, lam 0.8, V = [.5, .4, .2], R = 1 at the last token:
  //   t2: delta = 1 - .2 = .8,              A = .8
  //   t1: delta = .9*.2 - .4 = -.22,        A = -.22 + .72*.8 = .356
  //   t0: delta = .9*.4 - .5 = -.14,        A = -.14 + .72*.356 = .11632
  GaeOptions o;
  o.gamma = 0.9;
  o.lam = 0.8;
  o.whiten = false;
  auto g = GaeAdvantages(T1({1}), T2({{.5, .4, .2}}), T2({{1, 1, 1}}), o);
  REQUIRE(g.ok());
  CHECK(Diff(g->advantages, T2({{0.11632, 0.356, 0.8}})) < 1e-6);
  CHECK(Diff(g->returns, T2({{0.61632, 0.756, 1.0}})) < 1e-6);

  // The same response after a prompt token, before padding, and with a hole
  // in the middle: masked positions neither count nor break the chain.
  auto p = GaeAdvantages(T1({1, 1}), T2({{9, .5, .4, .2, 7}, {.5, 99, .4, .2, 3}}),
                         T2({{0, 1, 1, 1, 0}, {1, 0, 1, 1, 0}}), o);
  REQUIRE(p.ok());
  CHECK(Diff(p->advantages, T2({{0, 0.11632, 0.356, 0.8, 0}, {0.11632, 0, 0.356, 0.8, 0}})) <
        1e-6);

  // gamma = lam = 1 is Monte Carlo: A_t = R - V_t; with KL 1 per token at
  // coefficient 0.1, the rewards are [-.1, -.1, .9] and A_t = G_t - V_t.
  o.gamma = 1;
  o.lam = 1;
  auto mc = GaeAdvantages(T1({1}), T2({{.5, .4, .2}}), T2({{1, 1, 1}}), o);
  REQUIRE(mc.ok());
  CHECK(Diff(mc->advantages, T2({{0.5, 0.6, 0.8}})) < 1e-6);
  o.kl_coef = 0.1;
  auto kl = GaeAdvantages(T1({1}), T2({{.5, .4, .2}}), T2({{1, 1, 1}}), o, T2({{1, 1, 1}}));
  REQUIRE(kl.ok());
  CHECK(Diff(kl->advantages, T2({{0.2, 0.4, 0.7}})) < 1e-6);

  // Whitened advantages have mean 0 and (sample) std 1 over the mask.
  o.whiten = true;
  auto w = GaeAdvantages(T1({1, 0}), T2({{.5, .4, .2}, {.1, .3, 0}}), T2({{1, 1, 1}, {1, 1, 0}}),
                         o, T2({{1, 1, 1}, {0, 0, 0}}));
  REQUIRE(w.ok());
  at::Tensor vals = w->advantages.masked_select(T2({{1, 1, 1}, {1, 1, 0}}).gt(0));
  CHECK(std::abs(vals.mean().item<double>()) < 1e-6);
  CHECK(std::abs(vals.std().item<double>() - 1.0) < 1e-5);
  CHECK(w->advantages[1][2].item<double>() == 0.0);

  GaeOptions bad;
  bad.lam = 1.5;
  auto e = GaeAdvantages(T1({1}), T2({{.5}}), T2({{1}}), bad);
  CHECK(e.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(e.status().message().find("lam") != std::string::npos);
  CHECK(GaeAdvantages(T1({1}), T2({{.5, .1}}), T2({{1}}), GaeOptions()).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("whitening uses masked tokens only") {
  // Masked values 1, 2, 3: mean 2, sample variance 1.
  auto w = WhitenMasked(T2({{1, 2, 3, 100}}), T2({{1, 1, 1, 0}}), true, 0.0);
  REQUIRE(w.ok());
  CHECK(Diff(*w, T2({{-1, 0, 1, 0}})) < 1e-6);
  auto s = WhitenMasked(T2({{1, 2, 3, 100}}), T2({{1, 1, 1, 0}}), false, 0.0);
  REQUIRE(s.ok());
  CHECK(Diff(*s, T2({{1, 2, 3, 0}})) < 1e-6);
  CHECK(WhitenMasked(T2({{1, 2}}), T2({{1, 0}})).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("REINFORCE++ whitens returns-to-go over the batch") {
  at::Tensor mask = T2({{1, 1, 0}, {1, 1, 1}});
  // gamma 1: returns row 0 = [1, 1, -], row 1 = [0, 0, 0]. Masked values
  // {1, 1, 0, 0, 0}: mean .4, sample var (2*.36 + 3*.16)/4 = .3.
  auto a = ReinforcePlusPlusAdvantages(T1({1, 0}), mask);
  REQUIRE(a.ok());
  const double s = std::sqrt(0.3);
  CHECK(Diff(*a, T2({{.6 / s, .6 / s, 0}, {-.4 / s, -.4 / s, -.4 / s}})) < 1e-5);
  // gamma .5: row 0 = [.5, 1, -]: values {.5, 1, 0, 0, 0}, mean .3, var .2.
  auto g = ReinforcePlusPlusAdvantages(T1({1, 0}), mask, at::Tensor(), 0.0, 0.5);
  REQUIRE(g.ok());
  const double s2 = std::sqrt(0.2);
  CHECK(Diff(*g, T2({{.2 / s2, .7 / s2, 0}, {-.3 / s2, -.3 / s2, -.3 / s2}})) < 1e-5);
  // The gamma = 1 fast path equals the general recursion.
  auto near1 = ReinforcePlusPlusAdvantages(T1({1, 0}), mask, T2({{.1, .2, .3}, {.3, .2, .1}}),
                                           0.5, 1.0 - 1e-12);
  auto exact1 = ReinforcePlusPlusAdvantages(T1({1, 0}), mask, T2({{.1, .2, .3}, {.3, .2, .1}}),
                                            0.5, 1.0);
  REQUIRE(near1.ok());
  REQUIRE(exact1.ok());
  CHECK(Diff(*near1, *exact1) < 1e-5);
  CHECK(Diff(*exact1, *a) > 1e-2);  // The KL term changed something.
}

// Two "ranks" as threads: each GlobalSum call waits for the other rank's
// tensor and both get the sum.
class TwoRankSum {
 public:
  GlobalSum For(int rank) {
    return [this, rank](at::Tensor& t) -> absl::Status {
      std::unique_lock<std::mutex> lock(mu_);
      const int64_t round = round_;
      slot_[rank] = t.clone();
      if (++arrived_ == 2) {
        sum_ = slot_[0] + slot_[1];
        arrived_ = 0;
        ++round_;
        cv_.notify_all();
      } else {
        cv_.wait(lock, [&] { return round_ != round; });
      }
      t.copy_(sum_);
      return absl::OkStatus();
    };
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  at::Tensor slot_[2], sum_;
  int arrived_ = 0;
  int64_t round_ = 0;
};

TEST_CASE("whitening with a global sum equals whitening the concatenated batch") {
  // Rank 0 holds high rewards, rank 1 low ones: per-slice whitening differs.
  at::Tensor rewards = T1({5, 6, 0, 1});
  at::Tensor mask = T2({{1, 1, 1, 0}, {0, 1, 1, 1}, {1, 1, 0, 0}, {1, 1, 1, 1}});
  at::Tensor values = T2({{0.1, 0.2, 0.3, 0}, {0, 0.5, 0.1, 0.2}, {0.3, 0.3, 0, 0}, {0.1, 0, 0.2, 0.4}});
  auto full_rpp = ReinforcePlusPlusAdvantages(rewards, mask);
  GaeOptions o;
  auto full_gae = GaeAdvantages(rewards, values, mask, o);
  REQUIRE(full_rpp.ok());
  REQUIRE(full_gae.ok());
  TwoRankSum sum;
  absl::StatusOr<at::Tensor> rpp[2];
  absl::StatusOr<GaeResult> gae[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const int64_t a = 2 * r;
      rpp[r] = ReinforcePlusPlusAdvantages(rewards.narrow(0, a, 2), mask.narrow(0, a, 2), at::Tensor(), 0.0,
                                           1.0, sum.For(r));
      GaeOptions go;
      go.global_sum = sum.For(r);
      gae[r] = GaeAdvantages(rewards.narrow(0, a, 2), values.narrow(0, a, 2), mask.narrow(0, a, 2), go);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    REQUIRE(rpp[r].ok());
    REQUIRE(gae[r].ok());
    CHECK(Diff(*rpp[r], full_rpp->narrow(0, 2 * r, 2)) < 1e-6);
    CHECK(Diff(gae[r]->advantages, full_gae->advantages.narrow(0, 2 * r, 2)) < 1e-6);
  }
  // Without the global sum, each slice is whitened on its own: different.
  auto local = ReinforcePlusPlusAdvantages(rewards.narrow(0, 0, 2), mask.narrow(0, 0, 2));
  REQUIRE(local.ok());
  CHECK(Diff(*local, full_rpp->narrow(0, 0, 2)) > 0.1);
}

TEST_CASE("DAPO overlong penalty falls linearly over the buffer") {
  // max 20, buffer 5: free up to 15, then -(len - 15) / 5.
  auto p = OverlongPenalty(at::tensor({10, 15, 16, 20}, at::kLong), 20, 5, 1.0);
  REQUIRE(p.ok());
  CHECK(Diff(*p, T1({0, 0, -0.2, -1.0})) < 1e-7);
  auto q = OverlongPenalty(at::tensor({18}, at::kInt), 20, 5, 0.5);
  REQUIRE(q.ok());
  CHECK(Diff(*q, T1({-0.3})) < 1e-7);
  auto bad = OverlongPenalty(at::tensor({1}, at::kLong), 20, 0, 1.0);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("buffer") != std::string::npos);
}

TEST_CASE("zero-variance groups are detected") {
  auto z = ZeroVarianceGroups(T2({{1, 1, 1}, {0, 1, 0}, {.5, .5, .5}}));
  REQUIRE(z.ok());
  CHECK(z->to(at::kLong).equal(at::tensor({1, 0, 1}, at::kLong)));
  auto tol = ZeroVarianceGroups(T2({{1, 1.001, 1}}), 0.01);
  REQUIRE(tol.ok());
  CHECK(tol->item<bool>());
}

TEST_CASE("advantages expand to tokens under the mask") {
  auto e = ExpandToTokens(T2({{1, -1}}), T2({{0, 1, 1}, {1, 1, 0}}));
  REQUIRE(e.ok());
  CHECK(Diff(*e, T2({{0, 1, 1}, {-1, -1, 0}})) == 0);
  CHECK(ExpandToTokens(T1({1}), T2({{1}, {1}})).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlmesh::learner
