// The refill round size against hand-worked cases, and what counts as an
// informative group.
#include "coordinator/dynamic_sampling.h"

#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

TrajectoryGroup Group(std::vector<double> rewards) {
  TrajectoryGroup g;
  for (double r : rewards) g.add_samples()->set_reward(r);
  return g;
}

TEST_CASE("a group is informative when its rewards differ") {
  CHECK(RewardVaries(Group({0, 1, 0})));
  CHECK_FALSE(RewardVaries(Group({1, 1, 1})));
  CHECK_FALSE(RewardVaries(Group({0.5})));
  CHECK_FALSE(RewardVaries(Group({})));
  CHECK(CountInformative({Group({0, 1}), Group({1, 1}), Group({2, 0})}) == 2);
}

TEST_CASE("refill round size follows the rate of informative groups") {
  // 8 wanted, 8 generated, 2 informative: deficit 6 at rate 1/4 -> 24,
  // clamped to 8.
  CHECK(RefillRoundSize(8, 8, 2, 1000, 1) == 8);
  // 8 wanted, 8 generated, 6 informative: deficit 2, ceil(2 * 8 / 6) = 3.
  CHECK(RefillRoundSize(8, 8, 6, 1000, 1) == 3);
  // ... rounded up to a multiple of 2 shards: 4.
  CHECK(RefillRoundSize(8, 8, 6, 1000, 2) == 4);
  // No informative group yet: a whole step's worth.
  CHECK(RefillRoundSize(8, 8, 0, 1000, 1) == 8);
  // Enough already: nothing.
  CHECK(RefillRoundSize(8, 16, 9, 1000, 1) == 0);
  // Deficit 1 at rate 1/2: ceil(1 * 10 / 5) = 2.
  CHECK(RefillRoundSize(6, 10, 5, 1000, 1) == 2);
  // Only 3 unused prompts left with 2 shards: 2; 1 left: stop.
  CHECK(RefillRoundSize(8, 8, 0, 3, 2) == 2);
  CHECK(RefillRoundSize(8, 8, 0, 1, 2) == 0);
}

}  // namespace
}  // namespace rlmesh
