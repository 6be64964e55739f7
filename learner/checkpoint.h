#pragma once

// Learner checkpoints on disk: folder naming, the trainer_state.json record,
// verification, atomic commit and retention. No model code here: the trainer
// writes the tensors (HF model folder, optimizer safetensors) into a staging
// folder and uses these functions around it.
//
// A checkpoint folder `<checkpoint_dir>/step_<NNNNNN>` holds
//   config.json, model.safetensors   the policy (actor::SaveHfModel)
//   critic/                          PPO only: the critic, same layout
//   optimizer*.safetensors           AdamW moments (one per rank with ZeRO-1)
//   trainer_state.json               this record, written last, listing every
//                                    other file with its size and SHA-256
// A folder is valid only if trainer_state.json parses and every listed file
// exists with the recorded size and digest, so a partial or corrupted folder
// is refused with an error naming the file. Stateless functions; safe for
// concurrent use on distinct folders.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlmesh::learner {

struct FileDigest {
  // Bytes in the file.
  int64_t size = 0;
  // Lower-case hex SHA-256 of its contents.
  std::string sha256;
};

// Everything besides tensors that a resume needs.
struct TrainerState {
  // Format version of this record. Currently 1.
  int format = 1;
  // Experiment name, stage index into experiment.stages and its kind
  // ("sft", "grpo", "ppo").
  std::string experiment;
  int stage_index = 0;
  std::string stage_kind;
  // TrainSteps completed in this stage (the next TrainStep's number).
  int64_t step = 0;
  // Policy version after the last step.
  int64_t policy_version = 0;
  // Experiment seed; every random stream of training derives from
  // (seed, stage_index, step), so with the step it is the RNG state.
  uint64_t seed = 0;
  // SFT data cursor (PromptLoader).
  int64_t loader_epoch = 0;
  int64_t loader_index = 0;
  // AdamW steps taken by the policy and the critic optimizers (bias
  // correction and the LR schedule position).
  int64_t optimizer_steps = 0;
  int64_t critic_optimizer_steps = 0;
  // Shards that wrote it and whether optimizer state is sharded (ZeRO-1):
  // the per-rank files' layout, which learner/moments_layout.h reads back
  // under any other.
  int world_size = 1;
  bool zero1 = false;
  // learner.tp of the run that wrote it: a ZeRO-1 checkpoint's per-rank
  // moments are slices of that layout. Absent in older checkpoints (1).
  int tp = 1;
  // learner.ep of the run that wrote it: > 1 means one moments file per
  // rank, each its own experts'. Absent in older checkpoints (1).
  int ep = 1;
  // The tensor-parallel size PPO's critic was split over: its moments'
  // layout, as `tp` is the policy's. 1 = whole on every rank (also what
  // checkpoints written before the critic was split hold).
  int critic_tp = 1;
  // Files of the checkpoint (relative paths) with size and digest.
  std::map<std::string, FileDigest> files;
};

// "step_000042".
std::string CheckpointName(int64_t step);

// Serialises / parses trainer_state.json. Parse errors name the field.
std::string TrainerStateToJson(const TrainerState& state);
absl::StatusOr<TrainerState> TrainerStateFromJson(const std::string& text);

// Size and SHA-256 of a file.
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

// Reads `dir`/trainer_state.json and checks every listed file (size, digest,
// and safetensors headers). DATA_LOSS naming the file when anything is
// missing, truncated or altered; NOT_FOUND when the folder or the state file
// is absent.
absl::StatusOr<TrainerState> VerifyCheckpoint(const std::string& dir);

// step_* folders of `checkpoint_dir`, oldest first (by step number). Staging
// folders (".tmp-*") and other names are ignored. A missing dir is empty.
std::vector<std::string> ListCheckpoints(const std::string& checkpoint_dir);

struct FoundCheckpoint {
  std::string path;
  TrainerState state;
};

// The newest checkpoint in `checkpoint_dir` that verifies and whose
// stage_index equals `stage_index` (-1 = any). Folders refused on the way
// are appended to `refused` (if non-null) as "path: reason". NOT_FOUND when
// none qualifies.
absl::StatusOr<FoundCheckpoint> NewestValidCheckpoint(const std::string& checkpoint_dir,
                                                      int stage_index,
                                                      std::vector<std::string>* refused = nullptr);

// Moves the finished staging folder `staging` to `final_dir` atomically
// (rename(2) in the same parent; a previous folder of that name is moved
// aside first and removed after) and fsyncs the parent.
absl::Status CommitCheckpoint(const std::string& staging, const std::string& final_dir);

// Removes all but the newest `keep` step_* folders of `checkpoint_dir`
// (keep <= 0 keeps all).
absl::Status PruneCheckpoints(const std::string& checkpoint_dir, int keep);

}  // namespace rlmesh::learner
