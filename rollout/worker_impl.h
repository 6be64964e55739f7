#pragma once

// Private to the rollout worker's files: the request handle and the shared
// state of a RolloutWorker (RolloutWorker::Impl). The worker's work is split
// by job:
//   rollout_worker.cc  the public API (Submit, Cancel, Status, WaitIdle);
//   requests.cc        request validation, trajectories from generator output;
//   pipeline.cc        delivery to the caller, scoring and storing a group;
//   engine.cc          the engine thread: admission, generation, the fence;
//   episodes.cc        multi-turn rollouts: episodes of an environment server;
//   weights.cc         checkpoint loads and weight sync.
//
// Thread-safety: Impl is shared by the caller threads (Submit, Cancel, loads,
// Status), the engine thread, the environment threads and the pipeline
// threads; each member says what guards it. Lock order: load_mu before mu;
// RequestHandle::deliver_mu is taken without mu held.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "actor/generate.h"
#include "actor/model_config.h"
#include "actor/tokenizer.h"
#include "actor/transformer_fwd.h"
#include "common/thread_pool.h"
#include "environment/client.h"
#include "reward_server/circuit_breaker.h"
#include "rollout/rollout_worker.h"
#include "rollout/tp_engine.h"
#include "weight_sync/weight_sync.h"

namespace rlmesh::rollout {

inline int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

// One submitted Generate call. Shared by the caller (for Cancel), the engine
// thread and the pipeline threads; each member says what guards it.
class RequestHandle {
 public:
  // Constant after Submit.
  uint64_t id = 0;
  GenerateRequest request;
  actor::SamplingOptions sampling;
  RolloutWorker::GroupSink on_group;
  RolloutWorker::DoneCallback on_done;
  // Serialises the callbacks of this request; `closed` once on_done ran (no
  // callback after that).
  absl::Mutex deliver_mu;
  bool closed ABSL_GUARDED_BY(deliver_mu) = false;
  // Guarded by Impl::mu.
  int64_t groups_left = 0;
  absl::Status status;
  bool cancelled = false;
  bool done = false;
  int64_t version = 0;    // weights at admission
  std::string model_id;   // model at admission
  // When Submit took it (unix micros), for its trace span. Constant.
  int64_t submitted_us = 0;
};

// Multi-turn rollouts: the n episodes of one prompt of a request whose
// `environment` is set. An episode is touched by one thread at a time: the
// engine thread while its model turn decodes and is recorded, an environment
// thread while the environment answers; the hand-offs (the environment
// pool's queue, Impl::ready under mu) order those accesses, so its fields
// need no lock of their own. `remaining` and `ended` are guarded by Impl::mu.
struct EpisodeGroup {
  struct Episode {
    std::string episode_id;
    // Response so far: model and environment tokens, their behaviour
    // log-probs (0 for environment tokens) and loss mask.
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    std::vector<int32_t> mask;
    std::vector<Turn> turns;
    double env_reward = 0;
    int model_turns = 0;
    actor::FinishReason finish = actor::FinishReason::kStop;
    // Where a newer weights version took over (response index, version),
    // and the version of the latest model turn.
    std::vector<std::pair<int, int64_t>> switches;
    int64_t last_version = 0;
  };
  // Constant after creation.
  std::shared_ptr<RequestHandle> req;
  int prompt = 0;
  uint64_t key = 0;           // in Impl::episode_groups
  int64_t vocab_size = 0;     // of the weights at admission
  int64_t max_positions = 0;
  int max_turns = 0;
  int64_t max_total_tokens = 0;
  absl::Duration timeout;
  // See above.
  std::vector<Episode> episodes;
  // Guarded by Impl::mu.
  int remaining = 0;
  bool ended = false;  // delivered or failed; later events are dropped
};

struct RolloutWorker::Impl {
  struct ParamInfo {
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;
  };
  // A weight swap waiting for the fence; applied on the engine thread.
  struct Update {
    std::function<absl::Status()> apply;
    int64_t version = 0;
    std::string model_id;
    // Installed with the version when set (a checkpoint defines the shape).
    std::optional<actor::ModelConfig> config;
    std::map<std::string, ParamInfo> params;
    // With config: the parameter bytes each rank holds.
    std::vector<int64_t> rank_bytes;
    // A Sleep that releases the weights (the version stays); any other
    // update that succeeds brings weights back.
    bool releases_weights = false;
    bool done = false;
    absl::Status status;
  };
  struct Inflight {
    std::shared_ptr<RequestHandle> req;
    int prompt = 0;
    // Per sample: (response token index, version) where a resumed sample
    // switched to newer weights (partial rollout).
    std::map<int, std::vector<std::pair<int, int64_t>>> switches;
    // KV-cache rows reserved for it (released when it ends): n for a
    // single-turn group, 0 for a model turn (its episode group holds them).
    int64_t rows = 0;
    // Weights version when it was submitted.
    int64_t start_version = 0;
    // A model turn of a multi-turn episode: its group, sample, and the
    // request as submitted (prompt = prompt + response so far), which a
    // partial-rollout interruption resubmits.
    std::shared_ptr<EpisodeGroup> episodes;
    int sample = 0;
    std::vector<int64_t> turn_prompt;
    actor::SamplingOptions turn_sampling;
    int64_t turn_stream = 0;
  };

  // Constant after construction.
  const RolloutWorkerOptions options;
  const std::unique_ptr<actor::Tokenizer> tokenizer;
  const std::string tokenizer_hash;
  RewardClient* const reward;
  ReplayBufferClient* const replay;
  // When set, every multi-turn request uses it (tests); else a gRPC client
  // per environment address (env_clients).
  EnvironmentClient* const environment;

  mutable absl::Mutex mu;
  std::deque<std::shared_ptr<RequestHandle>> pending ABSL_GUARDED_BY(mu);
  std::map<uint64_t, Inflight> inflight ABSL_GUARDED_BY(mu);  // generator request id ->
  int64_t inflight_rows ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<Update> update ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  int64_t version ABSL_GUARDED_BY(mu) = 0;
  std::string model_id ABSL_GUARDED_BY(mu);
  std::optional<actor::ModelConfig> config ABSL_GUARDED_BY(mu);
  std::map<std::string, ParamInfo> params ABSL_GUARDED_BY(mu);
  std::vector<int64_t> rank_bytes ABSL_GUARDED_BY(mu);
  // Sleep(release_weights) released the parameters and no load has brought
  // them back: requests are refused, the engine builds no generator.
  bool weights_released ABSL_GUARDED_BY(mu) = false;
  int64_t generated_tokens ABSL_GUARDED_BY(mu) = 0;
  // CUDA graphs of the decode step since start, over every generator.
  int64_t graph_captures ABSL_GUARDED_BY(mu) = 0;
  int64_t graph_replays ABSL_GUARDED_BY(mu) = 0;
  // Engine thread only: the generator last counted and its counts then (a
  // generator's counts only grow; a new one starts from zero).
  const actor::GenerationEngine* graphs_of = nullptr;
  actor::DecodeGraphStats graphs_seen;
  int64_t failed_groups ABSL_GUARDED_BY(mu) = 0;
  int64_t dropped_groups ABSL_GUARDED_BY(mu) = 0;
  int64_t pipeline_busy ABSL_GUARDED_BY(mu) = 0;
  std::deque<std::pair<absl::Time, int64_t>> rate ABSL_GUARDED_BY(mu);  // (time, tokens) per step
  uint64_t next_request_id ABSL_GUARDED_BY(mu) = 1;
  uint64_t next_gen_id ABSL_GUARDED_BY(mu) = 1;
  std::atomic<int> active_sequences{0};
  // Multi-turn: episode groups not yet delivered, and model turns whose
  // environment answered, waiting for the engine to submit them.
  std::map<uint64_t, std::shared_ptr<EpisodeGroup>> episode_groups ABSL_GUARDED_BY(mu);
  uint64_t next_episode_group ABSL_GUARDED_BY(mu) = 1;
  std::deque<std::pair<std::shared_ptr<EpisodeGroup>, int>> ready ABSL_GUARDED_BY(mu);
  std::map<std::string, std::unique_ptr<EnvironmentClient>> env_clients ABSL_GUARDED_BY(mu);

  // Serialises weight loads (one update at a time) and guards the receiver.
  absl::Mutex load_mu;
  std::unique_ptr<weight_sync::WeightReceiver> receiver ABSL_GUARDED_BY(load_mu);
  std::string sync_group ABSL_GUARDED_BY(load_mu);
  // Receive buffers reused from one sync to the next.
  weight_sync::NamedTensors staging ABSL_GUARDED_BY(load_mu);
  // A sync in pieces (spec.pieces > 1): one receiver per piece, `receiver`
  // null. Rank r of the tensor_parallel ranks receives pieces
  // [r, r+1) * pieces / tensor_parallel.
  std::vector<std::unique_ptr<weight_sync::WeightReceiver>> piece_receivers ABSL_GUARDED_BY(load_mu);

  // Engine thread only. With tensor_parallel == 1, `model` is the policy
  // and `gen` a Generator over it, rebuilt after each swap. With
  // tensor_parallel > 1, `gen` is a TensorParallelEngine, which holds the
  // policy's slices (`model` stays null): a checkpoint makes a new one, a
  // sync reloads it (tp_engine()).
  std::shared_ptr<actor::TransformerImpl> model;
  std::unique_ptr<actor::GenerationEngine> gen;
  TensorParallelEngine* tp_engine() { return dynamic_cast<TensorParallelEngine*>(gen.get()); }
  // A new TensorParallelEngine (options.tensor_parallel ranks, the
  // generator options) shaped `config`, its weights unset. Any thread.
  absl::StatusOr<std::unique_ptr<TensorParallelEngine>> MakeTensorParallel(const actor::ModelConfig& config);
  // Every parameter of `params` exactly once in `tensors`, each with the
  // model's shape, divided by `tp` on its split dimension when tp > 1 (a
  // rank's slice): checked before the fence, so that a bad layout never
  // leaves the model half-written. INVALID_ARGUMENT naming the tensor.
  static absl::Status CheckAgainstModel(const weight_sync::NamedTensors& tensors,
                                        const std::map<std::string, ParamInfo>& params, int tp);
  // An Update's apply: `load` on the engine's ranks at the fence (a new
  // engine when the current one is broken or absent), or the tensors copied
  // into `model` by name.
  std::function<absl::Status()> ApplyToRanks(const actor::ModelConfig& config,
                                             std::function<absl::Status(TensorParallelEngine&)> load);
  // After a Sleep that released the weights, ApplyToModel gives each
  // parameter fresh storage of its shape before the copy.
  std::function<absl::Status()> ApplyToModel(std::shared_ptr<const weight_sync::NamedTensors> tensors);
  // A LoRA sync (every tensor an adapter's lora_A/lora_B, B scaled): the
  // model's adapters become these, on the base it holds.
  std::function<absl::Status()> ApplyAdapters(std::shared_ptr<const weight_sync::NamedTensors> tensors);
  // Before the fence: every adapter tensor names a linear layer of the
  // model (`params`, its base weights) and has the model's dtype.
  static absl::Status CheckAdapters(const weight_sync::NamedTensors& tensors,
                                    const std::map<std::string, ParamInfo>& params, int tp);
  // An Update's apply for Sleep: with `weights`, releases the parameters
  // (their storage; the shapes stay in `params`) or the tensor-parallel
  // ranks, adding the parameter bytes to `*released`, and marks the
  // weights released (the fence has dropped one model's generator
  // already). Fails (FAILED_PRECONDITION) when a request is queued or in
  // flight at the fence.
  std::function<absl::Status()> ApplySleep(bool weights, std::shared_ptr<int64_t> released);
  // Posts a weight-sync update of `bytes` received since `start`, waits for
  // its fence, and logs it.
  absl::StatusOr<LoadResult> FinishSync(std::shared_ptr<Update> u, int64_t bytes, absl::Time start)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu);
  // Receives version `version` in pieces (piece_receivers) and returns each
  // rank's slice, joined from its pieces and checked against `params` (the
  // loaded model's shapes). Each rank stops at its first failed piece, so a
  // failed sync takes one timeout at most, not one per piece.
  absl::StatusOr<std::vector<weight_sync::NamedTensors>> ReceivePieces(
      int64_t version, const std::map<std::string, ParamInfo>& params) ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu);
  // Groups interrupted by an update (partial rollout), resubmitted with
  // their tokens so far once the new weights are in.
  std::vector<actor::GenerationRequest> parked;

  // The reward server's circuit breaker (reward_call.breaker_*; the options
  // of the latest request). Safe for concurrent use: its own lock.
  CircuitBreaker reward_breaker{CircuitBreakerOptions{}};

  // Scores and stores finished groups (pipeline mode). Stopped (drained)
  // after the engine thread has ended, so Schedule never refuses.
  ThreadPool pipeline;
  // Calls the environment servers (Reset/Step/Close), so the engine thread
  // never waits on one. Stopped after the engine thread, before pipeline.
  ThreadPool env_pool;
  std::thread engine;

  Impl(RolloutWorkerOptions o, std::unique_ptr<actor::Tokenizer> t, RewardClient* r, ReplayBufferClient* b,
       EnvironmentClient* e)
      : options(std::move(o)),
        tokenizer(std::move(t)),
        tokenizer_hash(tokenizer ? tokenizer->Hash() : ""),
        reward(r),
        replay(b),
        environment(e),
        pipeline(options.pipeline_threads, "rollout-pipe"),
        env_pool(options.environment_threads, "rollout-env") {}


  // ---- requests and trajectories (requests.cc) ---------------------------

  absl::Status Validate(const GenerateRequest& r, actor::SamplingOptions* sampling) ABSL_SHARED_LOCKS_REQUIRED(mu);

  // Key of prompt i's random streams: its stream_key, else its position.
  static int64_t StreamKey(const GenerateRequest& r, int i);

  static std::string PromptId(const GenerateRequest& r, int i);

  // `switches`: version switches of resumed samples (may be null).
  TrajectoryGroup MakeGroup(const RequestHandle& req, int prompt, const actor::GroupResult* result,
                            const std::map<int, std::vector<std::pair<int, int64_t>>>* switches = nullptr);

  // ---- delivery and the reward/buffer pipeline (pipeline.cc) --------------

  void Deliver(const std::shared_ptr<RequestHandle>& req, TrajectoryGroup group, bool stored, absl::Status status);

  // Counts one group of `req` as delivered; ends the request after the last.
  void FinishOne(const std::shared_ptr<RequestHandle>& req, absl::Status status);

  // Ends a request that never reached the generator.
  void EndUndelivered(const std::shared_ptr<RequestHandle>& req, absl::Status status);

  void RunPipeline(std::shared_ptr<RequestHandle> req, TrajectoryGroup group);

  // Scores `group` under r.reward_call and stores it. `dropped`: the policy
  // dropped it after a failed Score call (OK returned, nothing stored).
  absl::Status ScoreAndStore(const GenerateRequest& r, TrajectoryGroup* group, bool* dropped);

  // ---- multi-turn episodes (episodes.cc) -----------------------------------

  // Validates request.environment; fills the turn stop sequences.
  absl::Status ValidateEnvironment(const GenerateRequest& r, actor::SamplingOptions* sampling)
      ABSL_SHARED_LOCKS_REQUIRED(mu);

  // Admission: makes the episode group of prompt `prompt` (rows already
  // reserved) and returns it; StartEpisodes (mu not held) resets them.
  std::shared_ptr<EpisodeGroup> NewEpisodeGroup(const std::shared_ptr<RequestHandle>& req, int prompt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void StartEpisodes(const std::shared_ptr<EpisodeGroup>& g);

  // Engine thread: the model turn `ready` to decode, registered in inflight.
  actor::GenerationRequest MakeTurn(const std::shared_ptr<EpisodeGroup>& g, int sample)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Engine thread (mu not held): a model turn ended; hands it to the
  // environment on an environment thread.
  void OnTurn(Inflight entry, actor::GroupResult result);

  // Environment threads.
  absl::StatusOr<EnvironmentClient*> EnvClient(const std::string& address);
  void ContinueOrEnd(const std::shared_ptr<EpisodeGroup>& g, int sample);
  void EndEpisode(const std::shared_ptr<EpisodeGroup>& g, int sample);
  // Ends the group with `s` (its episodes are closed, best effort).
  void FailEpisodes(const std::shared_ptr<EpisodeGroup>& g, const absl::Status& s);

  // The trajectories of a finished group.
  TrajectoryGroup MakeEpisodeGroup(const EpisodeGroup& g);

  // ---- the engine thread and the update fence (engine.cc) -----------------

  // Generator callback (engine thread, mu not held).
  void OnGroup(actor::GroupResult result);
  // Adds what `engine`'s CUDA graphs did since last counted to the totals.
  void CountGraphs(const actor::GenerationEngine& engine) ABSL_LOCKS_EXCLUDED(mu);

  void Loop();

  void FailInflight(uint64_t gen_id, const absl::Status& s);

  void FailAllInflight(const absl::Status& s);

  // Posts `u` and waits until the engine applied it at the fence.
  absl::Status PostUpdate(std::shared_ptr<Update> u);

  absl::Status CheckVersion(int64_t v) ABSL_SHARED_LOCKS_REQUIRED(mu);
};

}  // namespace rlmesh::rollout
