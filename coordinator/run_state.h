#pragma once

// What a run leaves in its run_dir so that `coordinator run --resume` can
// continue it:
//   runner_state.json     {"rollout_round": R, "weights_version": V}, written
//                         before every rollout round and weight load: rounds
//                         keep counting (trajectory ids stay unique) and the
//                         workers' versions keep increasing after a resume.
//   init_accuracy.json    {"accuracy": A}: the eval before the first stage.
//   stage-<i>.done.json   {"checkpoint": DIR, "accuracy": A[, "init_accuracy"]}:
//                         stage i finished; a resumed run skips it and
//                         starts stage i+1 from DIR.
// Every file is replaced atomically (temp + rename). Not thread-safe; the
// runner's thread owns it.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlmesh {

struct RunnerState {
  // Rollout rounds started so far, over all stages.
  int64_t rollout_round = 0;
  // Version the rollout workers last loaded (their numbering).
  int64_t weights_version = 0;
};

struct StageMarker {
  // Rank 0's final checkpoint of the stage.
  std::string checkpoint;
  // Held-out accuracy after the stage.
  double accuracy = 0;
  // Stage 0 only: accuracy before it.
  std::optional<double> init_accuracy;
};

class RunStateFiles {
 public:
  explicit RunStateFiles(std::string run_dir) : run_dir_(std::move(run_dir)) {}

  // NOT_FOUND when the run has none yet.
  absl::StatusOr<RunnerState> LoadState() const;
  absl::Status SaveState(const RunnerState& state) const;

  // NOT_FOUND while stage `i` has not finished.
  absl::StatusOr<StageMarker> ReadStageMarker(int i) const;
  absl::Status WriteStageMarker(int i, const StageMarker& marker) const;
  std::string StageMarkerPath(int i) const;

  absl::StatusOr<double> ReadInitAccuracy() const;
  absl::Status WriteInitAccuracy(double accuracy) const;

 private:
  const std::string run_dir_;
};

}  // namespace rlmesh
