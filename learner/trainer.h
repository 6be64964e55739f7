#pragma once

// Trainer: one data-parallel shard of the learner, without gRPC. It holds the
// policy (+ a frozen reference when KL is on, + a critic for PPO), the AdamW
// state (learner/data_parallel.h, also for world size 1), the stage's data and
// the step / policy-version counters, and implements the Learner RPC's
// semantics (proto/learner.proto) on plain messages:
//
//   Configure  builds everything for one stage of an experiment, resuming
//              from the newest valid checkpoint of that stage if one exists;
//   TrainStep  one step: SFT, reward model (Bradley-Terry) or DPO on a slice
//              of a global batch from the task or a pairs file, or
//              GRPO/RLOO/REINFORCE++/Dr.GRPO/PPO on groups (given, or pulled
//              from a GroupSource); step numbers are checked so a retried
//              call is never applied twice;
//   Save/Load  checkpoints (learner/checkpoint.h) that resume bit-exactly.
//
// Step numbering: `step()` counts completed TrainSteps of the stage; the
// next TrainStep must carry exactly that number (0 for the first).
//
// With world_size K > 1 every rank must make the same sequence of Configure,
// TrainStep, Save (and Load) calls: they run collectives.
//
// Not thread-safe except Status(), which may be called concurrently with
// anything (it reads a snapshot).

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dist/gloo_options.h"
#include "proto/learner.pb.h"

namespace rlmesh {
struct PreferencePair;
}  // namespace rlmesh

namespace rlmesh::learner {

// Where a shard's RL groups come from (the replay buffer in production, a
// fake in tests). Not owned by the Trainer; the Trainer calls it only from
// the thread that calls TrainStep, so an implementation used by one trainer
// needs no lock.
class GroupSource {
 public:
  virtual ~GroupSource() = default;
  struct Sampled {
    std::vector<TrajectoryGroup> groups;
    // Pass to Ack once trained on (empty = nothing to acknowledge).
    std::string ack_token;
  };
  // Exactly `num_groups` groups for `source` (FIFO with require_ack, or
  // drawn as source.mode says); waits at most `timeout`.
  virtual absl::StatusOr<Sampled> Sample(const BufferSource& source, int num_groups,
                                         absl::Duration timeout) = 0;
  virtual absl::Status Ack(const BufferSource& source, const std::string& ack_token) = 0;
};

struct TrainerOptions {
  // Time steps per chunk of the chunked log-prob computation (bounds the
  // [B, chunk, V] logits held at once). Default 64.
  int64_t logprob_chunk = 64;
  // Longest a GroupSource::Sample may wait. Default 120 s.
  absl::Duration sample_timeout = absl::Seconds(120);
  // Gloo group settings for world_size > 1 (timeout, threads).
  dist::GlooGroupOptions gloo;
  // Timeout of the c10d store connect/rendezvous, milliseconds. Default
  // 300000.
  int64_t store_timeout_ms = 300'000;
  // Where this shard trains when experiment.model.device is empty: "cpu",
  // "cuda" or "cuda:<index>" (the launcher's --device for the process).
  // Default "cpu".
  std::string device = "cpu";
  // RL steps: run the no-grad pass for the old log-probs even when the
  // training forward could supply them (one epoch, one mini-batch; see
  // TrainRl). The two give the same step bit for bit; this exists to test
  // that and to measure what the pass costs. Default false.
  bool recompute_old_logprobs = false;
  // RL steps: how the policy's (and reference's, teacher's) forward lays out
  // a micro-batch. kOff: one row per sequence, padded to the longest (the
  // critic always). kOn: the sequences first-fit, longest first, into rows
  // of the longest one's length, each its own attention segment, so short
  // responses share a row instead of padding it (batching.h PackSeqs). The
  // log-probs are the same up to floating-point summation order. kAuto:
  // packed when that removes at least a quarter of the micro-batch's row
  // slots, else rows. MoE policies are never packed (routing replay is laid
  // out by row). Default kAuto.
  enum class RlPacking { kAuto, kOff, kOn };
  RlPacking pack_rl = RlPacking::kAuto;
  // Packed RL micro-batches: a group's samples run their common prompt once,
  // as a prefix each sample's tokens attend to (batching.h PrefixSharing),
  // where the estimated FLOPs (linear layers plus attention pairs) drop.
  // The log-probs are the same up to floating-point summation order. Default
  // true.
  bool share_prompts = true;
  // Folders this shard may write into (common/path_root.h): the request's
  // checkpoint_dir, a Save path and a reward model's output must lie
  // inside one, else PERMISSION_DENIED naming the field. The launchers pass
  // the run's folder (`--write_roots`). Empty = anywhere. Default empty.
  std::vector<std::string> write_roots;

  absl::Status Validate() const;
};

class Trainer {
 public:
  explicit Trainer(TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // See the file comment and proto/learner.proto. Replaces any previous
  // configuration. INVALID_ARGUMENT names the offending field
  // ("experiment.stages[1].grpo.rl.optimizer.lr", "rank", ...).
  absl::StatusOr<ConfigureResponse> Configure(const ConfigureRequest& request);

  // The GroupSource for BufferSource steps; not owned, may be null. Set it
  // after Configure (Configure does not touch it).
  void set_group_source(GroupSource* source) { source_ = source; }

  // FAILED_PRECONDITION when not configured or request.step != step().
  absl::StatusOr<TrainStepResponse> TrainStep(const TrainStepRequest& request);

  // path "" = <checkpoint_dir>/step_<NNNNNN>, then keeps the newest
  // experiment.checkpoint.keep (default 3) step folders.
  absl::StatusOr<SaveResponse> Save(const std::string& path = "");
  // path "" = the newest valid checkpoint of this stage in checkpoint_dir
  // (corrupt ones are skipped and logged); an explicit path that does not
  // verify is DATA_LOSS naming the file.
  absl::StatusOr<LoadResponse> Load(const std::string& path = "");

  // Safe for concurrent use.
  LearnerStatus Status() const;

  // Reward-model and DPO stages: scores `pairs` with the current model, no
  // gradient; no collectives (any rank may call it alone) except under
  // ZeRO-3, TP and EP, where every rank must call it. Reward model:
  // rm_loss, rm_accuracy, rm_margin of the scores; DPO: dpo_loss,
  // dpo_accuracy, reward_margin, chosen_reward, rejected_reward of the
  // implicit rewards against the frozen reference. FAILED_PRECONDITION for
  // other stages.
  absl::StatusOr<std::map<std::string, double>> EvaluatePairs(const std::vector<PreferencePair>& pairs);

  // For tests and benchmarks: the policy's parameters under their Hugging
  // Face names (the live tensors). REQUIRES: configured. Under ZeRO-3, TP
  // and EP only rank 0's are whole, and under TP or ZeRO-3 with weight sync
  // in pieces only after GatherPolicy (or Save) since the last step:
  // between them its tensors are empty.
  std::vector<std::pair<std::string, at::Tensor>> PolicyParameters() const;
  // Makes rank 0's PolicyParameters() the whole current policy; every rank
  // must call it (a gather under TP or ZeRO-3 with weight sync in pieces,
  // where no rank keeps the whole policy between checkpoints; a no-op
  // elsewhere).
  // Save does it itself.
  absl::Status GatherPolicy();
  // The whole policy for a whole-model weight sync: rank 0's
  // PolicyParameters(). FAILED_PRECONDITION on other ranks, and under TP or
  // ZeRO-3 with weight sync in pieces (naming weight_sync.whole_model),
  // where rank 0 holds no whole copy to send.
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> WholePolicy() const;
  // What a whole-model weight sync sends: WholePolicy(), or for a LoRA
  // stage (experiment.model.lora) only the adapters, each lora_B multiplied
  // by its scaling (alpha / rank) so that the receiver applies them with
  // scaling 1 (actor::SetAdapters) on the base it already holds (the
  // checkpoint folder it loaded at the stage's start or a recovery). Rank
  // 0 only.
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> SyncTensors() const;
  // The policy's piece `piece` of `pieces` for weight sync between split
  // layouts (parallel::TensorParallelPiece), cut from what this rank holds:
  // under learner.tp > 1, rank t < tp (replica 0) holds slice t and so
  // pieces [t, t+1) * pieces / tp; under learner.zero: 3 with weight sync in
  // pieces, rank t of the world W holds slice t of W the same way;
  // otherwise rank 0 holds the whole policy. The tensors are views of the live weights, in
  // PolicyParameters() order. FAILED_PRECONDITION when this rank holds no
  // such piece or the learner is not configured; INVALID_ARGUMENT when
  // `pieces` does not split the model.
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> PolicyPiece(int piece, int pieces) const;
  // The policy model as an opaque pointer to actor::Transformer (tests
  // that generate with it include actor/transformer.h and cast).
  void* policy_model();
  // The policy's parameter elements this rank holds: its whole size, or
  // under ZeRO-3 its shards', under TP its slices', under a pipeline its
  // stage's (slices of them with TP; a tied copy not counted), under EP its
  // experts' and the replicated rest. Rank 0 may keep a whole copy for
  // weight sync besides (not counted).
  int64_t PolicyElementsHeld() const;
  // The critic's parameter elements this rank holds (PPO; 0 otherwise): its
  // whole size, or under ZeRO-3 its shards' and under TP its slices'
  // (frozen lm_head included).
  int64_t CriticElementsHeld() const;
  int64_t step() const { return step_; }
  int64_t policy_version() const { return version_; }

 private:
  struct State;

  // The stage's training data: the task's train split (SFT) or the
  // preference pairs (reward model, DPO), and the loader that walks it. RL
  // stages get their data from the caller.
  static absl::Status LoadStageData(const ExperimentConfig& experiment, int stage_index, State* state);
  // TrainStep's work, by stage kind and data source.
  absl::StatusOr<TrainStepResponse> RunStep(const TrainStepRequest& req);
  absl::StatusOr<TrainStepResponse> TrainSft();
  absl::StatusOr<TrainStepResponse> TrainPairs();
  // Forward (and with `train`, backward of the local mean loss) over
  // `pairs` in micro-batches; pair-weighted mean metrics into `metrics`.
  absl::Status PairPass(const std::vector<const PreferencePair*>& pairs, bool train,
                        std::map<std::string, double>* metrics);
  absl::StatusOr<TrainStepResponse> TrainRl(std::vector<TrajectoryGroup> groups, double seconds_sample);
  // The global batch `all` (every shard's same ordered copy): the refill
  // selection if configured, then this shard's slice through TrainRl.
  absl::StatusOr<TrainStepResponse> TrainRlGlobal(std::vector<TrajectoryGroup> all, double seconds_sample);
  // Counts a completed step (and a new policy version when `new_policy`),
  // publishes the status and returns `resp` with the version set.
  TrainStepResponse FinishStep(TrainStepResponse resp, bool new_policy);
  absl::Status LoadFrom(const std::string& dir);
  void PublishStatus();

  const TrainerOptions options_;
  GroupSource* source_ = nullptr;
  std::unique_ptr<State> s_;
  int64_t step_ = 0;
  int64_t version_ = 0;

  mutable absl::Mutex status_mu_;
  LearnerStatus status_ ABSL_GUARDED_BY(status_mu_);
};

}  // namespace rlmesh::learner
