// MergeStepMetrics: means over the data-parallel replicas (weighted by their
// mean_weight), counts summed,
// extremes and timings kept, whole-batch values from rank 0, tensor-parallel
// ranks of one replica counted once.
#include "coordinator/step_metrics.h"

#include <map>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

std::map<std::string, double> AsMap(const StepMetrics& m) { return {m.values().begin(), m.values().end()}; }

StepMetrics Of(const std::map<std::string, double>& values) {
  StepMetrics m;
  for (const auto& [k, v] : values) (*m.mutable_values())[k] = v;
  return m;
}

TEST_CASE("two data-parallel replicas: means averaged, counts summed, extremes and timings kept") {
  const StepMetrics merged = MergeStepMetrics(
      {Of({{"loss", 1.0}, {"reward_mean", 0.25}, {"tokens", 10}, {"groups", 4}, {"ratio_max", 1.1},
           {"ratio_min", 0.9}, {"seconds_forward_backward", 0.5}, {"grad_norm", 2.0}, {"lr", 1e-3}}),
       Of({{"loss", 3.0}, {"reward_mean", 0.75}, {"tokens", 20}, {"groups", 4}, {"ratio_max", 1.3},
           {"ratio_min", 0.8}, {"seconds_forward_backward", 0.7}, {"grad_norm", 2.0}, {"lr", 1e-3}})},
      1);
  const auto& v = merged.values();
  REQUIRE(v.size() == 9);
  CHECK(v.at("loss") == 2.0);
  CHECK(v.at("reward_mean") == 0.5);
  CHECK(v.at("tokens") == 30);
  CHECK(v.at("groups") == 8);
  CHECK(v.at("ratio_max") == 1.3);
  CHECK(v.at("ratio_min") == 0.8);
  CHECK(v.at("seconds_forward_backward") == 0.7);
  CHECK(v.at("grad_norm") == 2.0);
  CHECK(v.at("lr") == 1e-3);
}

TEST_CASE("tensor-parallel ranks of one replica count once") {
  // tp=2 x dp=2: ranks 0 and 1 are replica 0, ranks 2 and 3 replica 1.
  const std::vector<StepMetrics> ranks = {Of({{"loss", 1.0}, {"tokens", 10}}), Of({{"loss", 1.0}, {"tokens", 10}}),
                                          Of({{"loss", 4.0}, {"tokens", 30}}), Of({{"loss", 4.0}, {"tokens", 30}})};
  const auto merged = MergeStepMetrics(ranks, 2).values();
  CHECK(merged.at("loss") == 2.5);
  CHECK(merged.at("tokens") == 40);  // not 80
  // One replica of two ranks: rank 0's values.
  const auto one = MergeStepMetrics({ranks[0], ranks[1]}, 2).values();
  CHECK(one.at("tokens") == 10);
}

TEST_CASE("a key some replicas lack is merged over those that have it; one rank is unchanged") {
  const auto merged =
      MergeStepMetrics({Of({{"loss", 1.0}}), Of({{"loss", 3.0}, {"value_loss", 0.5}}), Of({{"loss", 5.0}})}, 1)
          .values();
  CHECK(merged.at("loss") == 3.0);
  CHECK(merged.at("value_loss") == 0.5);
  const StepMetrics alone = Of({{"loss", 1.5}, {"tokens", 7}});
  CHECK(AsMap(MergeStepMetrics({alone}, 1)) == AsMap(alone));
  CHECK(AsMap(MergeStepMetrics({alone}, 0)) == AsMap(alone));
}

TEST_CASE("means are weighted by each replica's mean_weight; a replica of weight 0 drops out") {
  // One process over both replicas' loss units: (1 * 1 + 3 * 5) / 4 = 4.
  const auto merged = MergeStepMetrics({Of({{"loss", 1.0}, {"entropy", 2.0}, {"mean_weight", 1}, {"tokens", 7}}),
                                        Of({{"loss", 5.0}, {"entropy", 6.0}, {"mean_weight", 3}, {"tokens", 9}}),
                                        Of({{"loss", 0.0}, {"entropy", 0.0}, {"mean_weight", 0}, {"tokens", 0}})},
                                       1)
                          .values();
  CHECK(merged.at("loss") == 4.0);
  CHECK(merged.at("entropy") == 5.0);
  CHECK(merged.at("mean_weight") == 4);
  CHECK(merged.at("tokens") == 16);
  // A replica without mean_weight (an older learner): unweighted, as before.
  const auto mixed = MergeStepMetrics({Of({{"loss", 1.0}, {"mean_weight", 1}}), Of({{"loss", 5.0}})}, 1).values();
  CHECK(mixed.at("loss") == 3.0);
  // Every replica of weight 0: unweighted.
  const auto none =
      MergeStepMetrics({Of({{"loss", 1.0}, {"mean_weight", 0}}), Of({{"loss", 5.0}, {"mean_weight", 0}})}, 1)
          .values();
  CHECK(none.at("loss") == 3.0);
}

}  // namespace
}  // namespace rlmesh
