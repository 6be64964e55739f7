#pragma once

// Weight sync between split layouts (M learner ranks -> N rollout ranks),
// without LibTorch: how many pieces the weights travel in, and each piece's
// own group. What a piece holds is learner::TensorParallelPiece.

#include "proto/common.pb.h"
#include "proto/config.pb.h"

namespace rlmesh::weight_sync {

// The number of pieces for a learner split over `learner_tp` ranks and
// rollout workers split over `rollout_tp` (both >= 1): the larger of the two
// when it is a multiple of the smaller, so that every rank on either side
// holds a run of whole pieces; 0 (the whole model from the learner's rank
// 0) when neither side is split or neither size divides the other.
int WeightPieces(int learner_tp, int rollout_tp);

// The learner ranks the weights are published from, each holding one slice
// (slice r of this many for rank r): the `learner_world` ranks of
// learner.zero: 3, with learner.tp or not (after each step every rank keeps
// its slice of the gathered weights), else 1 under learner.pp > 1 (rank 0
// gathers the whole policy, TP inside the stages or not), else learner.tp
// when it splits the model (replica 0's ranks), else 1.
int LearnerWeightSlices(const ExperimentConfig& exp, int learner_world);

// The pieces a run's weight sync travels in: WeightPieces(
// LearnerWeightSlices, rollout.tp), or 0 with weight_sync.whole_model.
// `learner_world` is the learner's world size (learner.shards). The
// coordinator asks for this many, and the learner plans its memory by it
// (with pieces no rank keeps a whole copy of a split policy between
// checkpoints).
int ConfiguredWeightPieces(const ExperimentConfig& exp, int learner_world);

// The spec of piece `piece`'s own group when the weights travel in
// spec.pieces pieces: spec.piece set, "-p<piece>" appended to the group
// name and (when set) to the shm prefix. Publisher and receivers of a piece
// both derive it from the same base spec.
WeightSyncSpec PieceSpec(const WeightSyncSpec& spec, int piece);

}  // namespace rlmesh::weight_sync
