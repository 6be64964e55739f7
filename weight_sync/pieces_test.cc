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
  CHECK(ConfiguredWeightPieces(exp) == 0);  // tp unset on both sides
  exp.mutable_learner()->set_tp(2);
  CHECK(ConfiguredWeightPieces(exp) == 2);
  exp.mutable_rollout()->set_tp(4);
  CHECK(ConfiguredWeightPieces(exp) == 4);
  exp.mutable_weight_sync()->set_whole_model(true);
  CHECK(ConfiguredWeightPieces(exp) == 0);
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
