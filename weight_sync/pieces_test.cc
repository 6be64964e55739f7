// How many pieces weight sync between tensor-parallel layouts travels in,
// and each piece's own group.
#include "weight_sync/pieces.h"

#include "catch2/catch.hpp"

namespace rlmesh::weight_sync {
namespace {

TEST_CASE("pieces: the larger tp when it is a multiple of the smaller, else the whole model") {
  CHECK(WeightPieces(1, 1) == 0);
  CHECK(WeightPieces(2, 1) == 2);
  CHECK(WeightPieces(1, 4) == 4);
  CHECK(WeightPieces(2, 4) == 4);
  CHECK(WeightPieces(4, 2) == 4);
  CHECK(WeightPieces(2, 2) == 2);
  CHECK(WeightPieces(3, 2) == 0);
  CHECK(WeightPieces(0, 0) == 0);

  ExperimentConfig exp;
  CHECK(ConfiguredWeightPieces(exp, 2) == 0);  // tp unset on both sides, plain DP
  exp.mutable_learner()->set_zero(1);
  CHECK(ConfiguredWeightPieces(exp, 2) == 0);
  exp.mutable_learner()->set_tp(2);
  CHECK(LearnerWeightSlices(exp, 4) == 2);  // replica 0's two ranks
  CHECK(ConfiguredWeightPieces(exp, 4) == 2);
  exp.mutable_rollout()->set_tp(4);
  CHECK(ConfiguredWeightPieces(exp, 4) == 4);
  exp.mutable_weight_sync()->set_whole_model(true);
  CHECK(ConfiguredWeightPieces(exp, 4) == 0);
  // Under a pipeline rank 0 gathers the whole policy, TP in its stages or
  // not: pieces only as the rollout's TP asks.
  exp.mutable_weight_sync()->set_whole_model(false);
  exp.mutable_learner()->set_pp(2);
  CHECK(LearnerWeightSlices(exp, 8) == 1);
  CHECK(ConfiguredWeightPieces(exp, 8) == 4);
  exp.mutable_rollout()->set_tp(1);
  CHECK(ConfiguredWeightPieces(exp, 8) == 0);
}

TEST_CASE("pieces under learner.zero: 3: one slice per learner rank") {
  ExperimentConfig exp;
  exp.mutable_learner()->set_zero(3);
  CHECK(LearnerWeightSlices(exp, 1) == 1);
  CHECK(ConfiguredWeightPieces(exp, 1) == 0);  // one rank holds it all
  CHECK(LearnerWeightSlices(exp, 4) == 4);
  CHECK(ConfiguredWeightPieces(exp, 4) == 4);
  exp.mutable_rollout()->set_tp(2);
  CHECK(ConfiguredWeightPieces(exp, 4) == 4);  // each rollout rank takes 2
  exp.mutable_rollout()->set_tp(3);
  CHECK(ConfiguredWeightPieces(exp, 4) == 0);  // 3 does not divide 4: whole
  exp.mutable_rollout()->set_tp(1);
  // With TP inside the replicas still every rank: ZeRO-3 shards the slices.
  exp.mutable_learner()->set_tp(2);
  CHECK(LearnerWeightSlices(exp, 4) == 4);
  CHECK(ConfiguredWeightPieces(exp, 4) == 4);
  exp.mutable_weight_sync()->set_whole_model(true);
  CHECK(ConfiguredWeightPieces(exp, 4) == 0);
}

TEST_CASE("a piece's spec names its own group and shared-memory prefix") {
  WeightSyncSpec spec;
  spec.set_group_name("run-g0");
  spec.set_pieces(4);
  WeightSyncSpec p = PieceSpec(spec, 3);
  CHECK(p.piece() == 3);
  CHECK(p.pieces() == 4);
  CHECK(p.group_name() == "run-g0-p3");
  CHECK(p.shm_prefix().empty());
  spec.set_shm_prefix("/rlmesh-x");
  CHECK(PieceSpec(spec, 0).shm_prefix() == "/rlmesh-x-p0");
}

}  // namespace
}  // namespace rlmesh::weight_sync
