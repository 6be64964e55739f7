#include "coordinator/pass_at_k.h"

#include <cmath>

#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

// C(n, k) the slow, obvious way.
double Binomial(int n, int k) {
  if (k < 0 || k > n) return 0;
  double r = 1;
  for (int i = 1; i <= k; ++i) r = r * (n - k + i) / i;
  return r;
}

TEST_CASE("pass@k matches 1 - C(n-c, k) / C(n, k) on hand-computed cases") {
  CHECK(PassAtK(4, 1, 1) == Approx(0.25));        // 1 - 3/4
  CHECK(PassAtK(4, 1, 2) == Approx(0.5));         // 1 - C(3,2)/C(4,2) = 1 - 3/6
  CHECK(PassAtK(4, 2, 2) == Approx(5.0 / 6));     // 1 - C(2,2)/C(4,2) = 1 - 1/6
  CHECK(PassAtK(5, 2, 3) == Approx(0.9));         // 1 - C(3,3)/C(5,3) = 1 - 1/10
  CHECK(PassAtK(10, 3, 4) == Approx(5.0 / 6));    // 1 - C(7,4)/C(10,4) = 1 - 35/210
  CHECK(PassAtK(8, 1, 8) == Approx(1.0));         // every draw holds the right one
  CHECK(PassAtK(4, 3, 2) == Approx(1.0));         // n-c < k
  CHECK(PassAtK(4, 0, 1) == Approx(0.0));
  CHECK(PassAtK(4, 0, 4) == Approx(0.0));
  CHECK(PassAtK(4, 4, 1) == Approx(1.0));
}

TEST_CASE("pass@k equals the binomial formula everywhere up to n = 16") {
  for (int n = 1; n <= 16; ++n) {
    for (int c = 0; c <= n; ++c) {
      for (int k = 1; k <= n; ++k) {
        INFO("n=" << n << " c=" << c << " k=" << k);
        CHECK(PassAtK(n, c, k) == Approx(1.0 - Binomial(n - c, k) / Binomial(n, k)).margin(1e-12));
      }
    }
  }
}

TEST_CASE("mean pass@k averages over prompts") {
  CHECK(MeanPassAtK({1, 2}, 4, 2) == Approx((0.5 + 5.0 / 6) / 2));
  CHECK(MeanPassAtK({0, 0, 4}, 4, 1) == Approx(1.0 / 3));
  CHECK(MeanPassAtK({}, 4, 1) == 0);
}

}  // namespace
}  // namespace rlmesh
