// The pipeline schedules: 1F1B and the interleaved order written out by
// hand for small shapes, every pass run exactly once, no deadlock over a
// range of shapes (micro-batch counts that are not multiples of the stages
// included), and the simulated bubble against (P - 1) / (V M + P - 1).
#include "parallel/pipeline_schedule.h"

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "catch2/catch.hpp"

namespace rlmesh::parallel {
namespace {

// "F<micro>.<chunk>" / "B<micro>.<chunk>", space-separated.
std::string Written(int stages, int stage, int chunks, int64_t micro) {
  auto ops = PipelineSchedule(stages, stage, chunks, micro);
  REQUIRE(ops.ok());
  std::vector<std::string> out;
  for (const PipelineOp& op : *ops) out.push_back(absl::StrCat(op.forward ? "F" : "B", op.micro, ".", op.chunk));
  return absl::StrJoin(out, " ");
}

TEST_CASE("1F1B: stage s runs P - 1 - s forwards, then one forward and one backward, then the rest") {
  CHECK(Written(4, 0, 1, 6) == "F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 B3.0 B4.0 B5.0");
  CHECK(Written(4, 3, 1, 6) == "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 F5.0 B5.0");
  CHECK(Written(4, 1, 1, 2) == "F0.0 F1.0 B0.0 B1.0");
}

TEST_CASE("interleaved: groups of P micro-batches through the chunks, backwards from the last chunk") {
  // P = 2, V = 2, M = 4: stage 0 warms up with 2 (P - 1) + (V - 1) P = 4
  // forwards, stage 1 with 2.
  CHECK(Written(2, 0, 2, 4) ==
        "F0.0 F1.0 F0.1 F1.1 "
        "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "
        "B2.1 B3.1 B2.0 B3.0");
  CHECK(Written(2, 1, 2, 4) ==
        "F0.0 F1.0 "
        "F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 "
        "B2.0 B3.0");
  // M = P: every forward first.
  CHECK(Written(2, 1, 2, 2) == "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  // M = 3 at P = 2: M = 4's order without micro-batch 3.
  CHECK(Written(2, 0, 2, 3) == "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 B1.1 F2.1 B0.0 B1.0 B2.1 B2.0");
}

TEST_CASE("every stage runs each forward and each backward once, the forward first, and no shape deadlocks") {
  for (int P = 1; P <= 6; ++P) {
    for (int V = 1; V <= (P > 1 ? 4 : 1); ++V) {
      for (int64_t M = 1; M <= 4 * P + 1; ++M) {
        CAPTURE(P, V, M);
        for (int s = 0; s < P; ++s) {
          auto ops = PipelineSchedule(P, s, V, M);
          REQUIRE(ops.ok());
          REQUIRE(ops->size() == static_cast<size_t>(2 * M * V));
          std::set<std::tuple<bool, int64_t, int>> seen;
          for (const PipelineOp& op : *ops) {
            REQUIRE(op.micro >= 0);
            REQUIRE(op.micro < M);
            REQUIRE(op.chunk >= 0);
            REQUIRE(op.chunk < V);
            REQUIRE(seen.insert({op.forward, op.micro, op.chunk}).second);
            if (!op.forward) REQUIRE(seen.count({true, op.micro, op.chunk}) == 1);
          }
        }
        auto sim = SimulatePipeline(P, V, M);
        REQUIRE(sim.ok());
        // 1F1B's bound on what a stage holds.
        if (V == 1) {
          for (int s = 0; s < P; ++s) CHECK(sim->max_in_flight[s] == std::min<int64_t>(P - s, M));
        }
      }
    }
  }
}

TEST_CASE("the simulated bubble is (P - 1) / (V M + P - 1) when P divides M, and interleaving shrinks it") {
  for (int P : {2, 4}) {
    for (int V : {1, 2, 4}) {
      for (int64_t M : {P, 2 * P, 4 * P}) {
        CAPTURE(P, V, M);
        auto sim = SimulatePipeline(P, V, M);
        REQUIRE(sim.ok());
        CHECK(sim->bubble == Approx(TheoreticalBubble(P, V, M)).margin(1e-12));
        if (V > 1) {
          auto plain = SimulatePipeline(P, 1, M);
          REQUIRE(plain.ok());
          CHECK(sim->bubble < plain->bubble);
          // The price: more activations in flight (in chunks of 1/V the
          // layers) on the first stage than 1F1B's P.
          CHECK(sim->max_in_flight[0] > P);
        }
      }
    }
  }
}

TEST_CASE("layers in flight weigh each held chunk by its layers") {
  // P = 2, V = 2, M = 2: every forward first, so each stage holds all of
  // its chunks for both micro-batches at once.
  auto sim = SimulatePipeline(2, 2, 2, 1.0, 2.0, {1, 3, 2, 5});
  REQUIRE(sim.ok());
  CHECK(sim->max_in_flight == std::vector<int64_t>{4, 4});
  CHECK(sim->max_layers_in_flight == std::vector<int64_t>{2 * (1 + 2), 2 * (3 + 5)});
  // 1F1B at P = 2, M = 4: stage 0 holds two micro-batches of its 3 layers.
  auto plain = SimulatePipeline(2, 1, 4, 1.0, 2.0, {3, 1});
  REQUIRE(plain.ok());
  CHECK(plain->max_layers_in_flight == std::vector<int64_t>{6, 1});
  CHECK(!SimulatePipeline(2, 2, 2, 1.0, 2.0, {1, 1}).ok());
}

TEST_CASE("bad shapes are refused by field") {
  auto no_stages = PipelineSchedule(0, 0, 1, 4);
  CHECK(absl::StrContains(no_stages.status().message(), "learner.pp:"));
  auto lone = PipelineSchedule(1, 0, 2, 4);
  CHECK(absl::StrContains(lone.status().message(), "learner.pp_virtual_stages"));
  auto none = PipelineSchedule(2, 0, 2, 0);
  CHECK(absl::StrContains(none.status().message(), "learner.pp_microbatches"));
  CHECK(!PipelineSchedule(2, 2, 1, 4).ok());
  CHECK(!SimulatePipeline(2, 0, 4).ok());
}

}  // namespace
}  // namespace rlmesh::parallel
