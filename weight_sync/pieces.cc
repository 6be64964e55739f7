#include "weight_sync/pieces.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rlmesh::weight_sync {

int WeightPieces(int learner_tp, int rollout_tp) {
  const int lo = std::max(std::min(learner_tp, rollout_tp), 1);
  const int hi = std::max(learner_tp, rollout_tp);
  if (hi <= 1 || hi % lo != 0) return 0;
  return hi;
}

int LearnerWeightSlices(const ExperimentConfig& exp, int learner_world) {
  // ZeRO-3 (with TP or not): every rank keeps slice r of the whole world.
  if (exp.learner().zero() == 3) return std::max(learner_world, 1);
  // A pipeline (with TP inside its stages or not) gathers the whole policy
  // on rank 0.
  if (exp.learner().pp() > 1) return 1;
  if (exp.learner().tp() > 1) return exp.learner().tp();
  return 1;
}

int ConfiguredWeightPieces(const ExperimentConfig& exp, int learner_world) {
  if (exp.weight_sync().whole_model()) return 0;
  return WeightPieces(LearnerWeightSlices(exp, learner_world), std::max(exp.rollout().tp(), 1));
}

WeightSyncSpec PieceSpec(const WeightSyncSpec& spec, int piece) {
  WeightSyncSpec out = spec;
  out.set_piece(piece);
  out.set_group_name(absl::StrCat(spec.group_name(), "-p", piece));
  if (!spec.shm_prefix().empty()) out.set_shm_prefix(absl::StrCat(spec.shm_prefix(), "-p", piece));
  return out;
}

}  // namespace rlmesh::weight_sync
