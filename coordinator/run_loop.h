#pragma once

// The experiment loop behind ExperimentRunner (private to the :runner
// target). One class, its methods split by job over these files:
//   stages.cc         Run, stage driving, resume markers, status/summary
//   learners.cc       configure / train / save every learner shard
//   weights.cc        weights into the rollout workers (sync group or folder)
//   generation.cc     prompts, sampling params, Generate and Score calls
//   evaluation.cc     held-out greedy accuracy and pass@k
//   recovery.cc       the step loop that survives a restarted role
//   rl_loop.cc        SFT-like stages, synchronous RL, the after-step tail
//   async_rl_loop.cc  asynchronous RL (producer thread, max_staleness)
// Roles are reached only through role_clients.h, so tests drive the whole
// loop with fakes.
//
// Threads: Run() runs on one thread (the "run thread"); status() and
// summary() may be called from any thread; Cancel (through `cancelled_`)
// from any. Asynchronous RL starts one producer thread per stage that calls
// only the methods marked "Producer-safe" below; the run thread joins it
// before the stage ends.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "actor/tokenizer.h"
#include "coordinator/metrics_sink.h"
#include "coordinator/policy_versions.h"
#include "coordinator/role_clients.h"
#include "coordinator/run_state.h"
#include "coordinator/runner_options.h"
#include "nlohmann/json.hpp"
#include "proto/coordinator.pb.h"
#include "tasks/task.h"

namespace rlmesh {

// What the straggler deadline (rollout.request_timeout_ms) and the reward
// policy (reward.call.on_failure drop_group) did to Generate calls.
struct StragglerCounts {
  // Worker calls cancelled at the deadline.
  int timed_out_requests = 0;
  // Prompts re-sent to another worker, and prompts given up (on_timeout
  // drop).
  int redispatched_prompts = 0;
  int dropped_prompts = 0;
  // Groups a worker dropped because their Score call failed.
  int dropped_groups = 0;
  // Prompts that yield no group this step.
  int missing() const { return dropped_prompts + dropped_groups; }
};

// One RL stage step's rollouts (RunLoop::GenerateStep).
struct StepRollouts {
  std::vector<TrajectoryGroup> groups;
  // Extra (refill) rounds run, and groups whose rewards vary.
  int refill_rounds = 0;
  int informative = 0;
  StragglerCounts stragglers;
};

class RunLoop {
 public:
  // `clients`: the roles to drive; null connects to options' addresses over
  // gRPC when Run() starts. `cancelled` must outlive the loop.
  RunLoop(RunnerOptions options, const std::atomic<bool>* cancelled, std::unique_ptr<RoleClients> clients);

  // Run thread. Called once.
  absl::Status Run();
  // Any thread.
  ExperimentStatus status() const;
  RunSummary summary() const;

 private:
  // --- stages.cc ----------------------------------------------------------
  // Refuses a run whose model folder names no stop token (and whose
  // experiment sets none); prints the stop ids and where they came from.
  absl::Status CheckStopTokens();
  absl::Status RunStages();
  absl::Status RunStage(int index, std::string* init);
  // Thread-safe (status_ under mu_).
  void SetPhase(const std::string& phase);
  void SetMetric(const std::string& key, double value);
  void AddMetric(const std::string& key, double delta);
  void AddAccuracy(const std::string& label, double accuracy);
  // Producer-safe.
  absl::Status CheckCancelled() const;
  absl::Status SaveRunnerState();
  const ExperimentConfig& cfg() const { return o_.experiment; }
  static int64_t StageSteps(const Stage& s);
  // Prints a line for a person (RunnerOptions::progress).
  void Print(const std::string& line) const;

  // --- learners.cc --------------------------------------------------------
  // Configures every shard for stage `stage_index` from `init` (empty = the
  // model config's init) and fixes the version offset.
  absl::Status ConfigureLearners(int stage_index, const std::string& init);
  // Saves on every shard (rank 0 writes the model); returns rank 0's folder.
  absl::StatusOr<std::string> SaveAll(const std::string& path = "");
  absl::StatusOr<StepMetrics> TrainStep(const std::function<void(TrainStepRequest*)>& fill);
  // One step on the stage's next groups from the buffer, none older than
  // max_staleness versions; `num_groups` = 0 means prompts_per_step (a
  // refill step trains on every group it generated, see GenerateStep).
  absl::StatusOr<StepMetrics> TrainFromBuffer(const Stage& stage, const RlStage& rl, int num_groups = 0);

  // --- weights.cc ---------------------------------------------------------
  absl::Status SyncWeights(bool through_checkpoint = false);
  absl::Status SyncThroughGroup();
  // "shm", "gloo", "nccl", "cuda_ipc", "auto" (the configured backend), or
  // "checkpoint" once weight_sync.fallback took over.
  std::string WeightSyncName() const;
  // The port of the c10d store learner 0 hosts (asked once, then cached
  // until recovery). `timeout_ms`: the store server's wait timeout.
  absl::StatusOr<int> LearnerStorePort(int64_t timeout_ms);
  absl::Status LoadIntoRollouts(const std::function<void(LoadWeightsRequest*)>& fill);
  // rollout.sleep: every worker frees its memory for the train phase (the
  // step's SyncWeights wakes it); records the bytes and seconds in `j`.
  absl::Status SleepRollouts(nlohmann::json* j);
  std::string ShmPrefixBase() const;
  void RemoveSharedMemory();

  // --- generation.cc (all Producer-safe: they read only what is constant
  // while a stage runs: o_, clients_, tokenizer_, task_) ----------------
  Prompt MakePrompt(const Example& e) const;
  uint64_t RolloutSeed(int stage_index, int64_t step) const;
  SamplingParams Sampling(bool greedy, uint64_t seed) const;
  // Splits prompts over the workers and collects their groups; a worker
  // refuses (ABORTED) while it holds weights older than `min_version`.
  // `record_routing`: the trajectories carry their MoE routes
  // (rl.routing_replay). A worker call that outlives
  // rollout.request_timeout_ms is cancelled and its missing prompts are
  // re-sent to the next worker that has not timed out in this call (same
  // ids, stream keys and round: the same trajectory ids, which the replay
  // buffer stores once) or dropped (rollout.on_timeout); `counts`, when
  // set, is added what happened. Groups dropped by the reward policy are
  // left out and counted too.
  absl::StatusOr<std::vector<TrajectoryGroup>> Generate(const std::vector<Prompt>& prompts, int n,
                                                        const SamplingParams& sampling, bool pipeline, int64_t round,
                                                        int64_t min_version, bool record_routing = false,
                                                        StragglerCounts* counts = nullptr) const;
  absl::StatusOr<ScoreResponse> Score(const std::vector<TrajectoryGroup>& groups) const;
  // One RL stage step's rollouts (pipeline mode: stored in the buffer as
  // they come): `prompts` first; with rl.dynamic_sampling.mode refill, then
  // up to max_rounds extra rounds of fresh prompts (dynamic_sampling.h)
  // until prompts_per_step groups have nonzero reward variance. Refill
  // prompts come from a loader seeded by (stage, step), never one the step
  // already used, so resuming a step redraws the same ones and the main
  // loader still advances one batch per step.
  absl::StatusOr<StepRollouts> GenerateStep(const RlStage& rl, const std::vector<Prompt>& prompts, int stage_index,
                                            int64_t step, int64_t round, int64_t min_version) const;

  // --- evaluation.cc ------------------------------------------------------
  // `samples`, when given, gets one JSON object per generated sample
  // (greedy and pass@k draws), as `coordinator eval` writes them.
  absl::StatusOr<double> Evaluate(const std::string& label, int64_t step, bool final, bool pass_at = true,
                                  std::vector<nlohmann::json>* samples = nullptr);
  void RecordEvalSamples(const std::string& kind, const std::vector<TrajectoryGroup>& groups,
                         const ScoreResponse& scores, const std::vector<bool>& right,
                         std::vector<nlohmann::json>* out) const;
  // One JSON line per sample into `path` (its folder created), atomically.
  absl::Status WriteEvalSamples(const std::string& path, const std::vector<nlohmann::json>& samples) const;
  // RunnerOptions.evaluate_folder: loads the folder into the rollout
  // workers, evaluates it, writes the samples and prints a summary table.
  absl::Status EvaluateFolder(const std::string& folder);

  // --- recovery.cc --------------------------------------------------------
  // Runs `step` until the stage is done, recovering from a dead role at most
  // kMaxRecoveries times in a row; `rewind` runs after each recovery.
  absl::Status RunSteps(int64_t total, const std::function<absl::Status()>& step,
                        const std::function<void()>& rewind = nullptr);
  absl::Status Recover();

  // --- rl_loop.cc ---------------------------------------------------------
  absl::Status RunSft(const Stage& stage);
  absl::Status RunRl(const Stage& stage);
  nlohmann::json StepRecord(const Stage& stage, const StepMetrics& m);
  // A refill step's counts into its record (dynamic_sampling_groups_generated,
  // dynamic_sampling_groups_informative, dynamic_sampling_refill_rounds);
  // the learner adds how many it kept (groups, refill_groups_*).
  static void RecordRefill(int generated, int informative, int refill_rounds, nlohmann::json* record);
  // A step's straggler and dropped-group counts into its record
  // (rollout_timeouts, rollout_redispatched_prompts, rollout_dropped_prompts
  // when rollout.request_timeout_ms is set; reward_dropped_groups under
  // on_failure drop_group) and the status's running totals.
  void RecordStragglers(const StragglerCounts& counts, nlohmann::json* record);
  // With rollout.cuda_graphs: the step's captures and replays over every
  // worker (cuda_graph_captures, cuda_graph_replays).
  absl::Status RecordGraphs(nlohmann::json* record);
  // How many groups the learner takes for a step that generated `groups`:
  // 0 (prompts_per_step) unless refilling or some prompts yield no group;
  // UNAVAILABLE when none is left to train on.
  absl::StatusOr<int> GroupsToTrain(const RlStage& rl, int groups, const StragglerCounts& counts) const;
  absl::Status AfterStep(const Stage& stage, int64_t total, nlohmann::json* record);
  absl::Status TrimBuffer();

  // --- async_rl_loop.cc ---------------------------------------------------
  absl::Status RunRlAsync(const Stage& stage);

  // Constant after construction.
  const RunnerOptions o_;
  const std::atomic<bool>* const cancelled_;
  const RunStateFiles files_;

  // Set once by RunStages before any stage, then constant (the producer
  // thread reads them).
  std::unique_ptr<RoleClients> clients_;
  std::unique_ptr<actor::Tokenizer> tokenizer_;
  std::unique_ptr<Task> task_;

  // Run thread only (the producer thread never touches these; it gets the
  // versions it needs through AsyncRollout's lock).
  MetricsSink metrics_;
  PolicyVersions versions_;
  int stage_index_ = 0;
  // Steps the current stage's learners have taken.
  int64_t stage_step_ = 0;
  // Rollout rounds over all stages and resumes (trajectory ids).
  int64_t global_step_ = 0;
  // Weights the current stage started from (for re-configuring after a crash).
  std::string stage_init_;
  // The current SFT stage met its stop rule (sft.until).
  bool until_reached_ = false;
  // Port of the c10d store learner 0 hosts for the learner group and the
  // weight-sync group (0 = not asked yet; recovery forgets it, a restarted
  // learner hosts a new one); learner-group configurations so far (each
  // rendezvous under a prefix of its own).
  int store_port_ = 0;
  int learner_group_generation_ = 0;
  // Weight-sync group state: the group's generation (bumped by recovery).
  bool sync_unavailable_ = false;
  bool group_sync_worked_ = false;
  bool sync_configured_ = false;
  // The dtype every publish casts to: what the workers said they hold.
  std::string sync_dtype_;
  // The workers' CUDA-graph captures and replays at the last step (summed).
  std::pair<int64_t, int64_t> graph_totals_{0, 0};
  int sync_generation_ = 0;
  double last_sync_seconds_ = 0;
  // Bytes the last sync published through the weight-sync group (a LoRA
  // stage's adapters, or the whole policy); -1 after a checkpoint sync.
  int64_t last_sync_bytes_ = -1;
  std::string last_weights_dir_;

  // What status() and summary() report: written by the run thread, read by
  // any thread.
  mutable absl::Mutex mu_;
  ExperimentStatus status_ ABSL_GUARDED_BY(mu_);
  // When the current phase began (unix micros), for its trace span.
  int64_t phase_start_us_ ABSL_GUARDED_BY(mu_) = 0;
  RunSummary summary_ ABSL_GUARDED_BY(mu_);
};

// Errors a restarted role explains (recovery.cc).
bool Recoverable(const absl::Status& s);

// The dtype the weight sync carries: the one every rollout worker reports
// holding (`dtypes`, weight-sync names, "" = unsaid). INVALID_ARGUMENT when
// two workers differ, or when rollout.dtype is set and differs from theirs.
absl::StatusOr<std::string> AgreedRolloutDtype(const RolloutConfig& rollout, const std::vector<std::string>& dtypes);

// Runs fn(i) for i in [0, n) on n threads; returns the first error.
absl::Status ParallelFor(int n, const std::function<absl::Status(int)>& fn);
// Seconds since `start`.
double Seconds(absl::Time start);
// splitmix64 over (seed, salt): independent seeds from one experiment seed.
uint64_t MixSeed(uint64_t seed, uint64_t salt);

}  // namespace rlmesh
