#pragma once

// RolloutWorker: the rollout engine without gRPC. Holds the policy, runs the
// actor/ Generator (continuous batching) on one engine thread, turns finished
// groups into TrajectoryGroup messages and hands each one to its request's
// callback as soon as all its samples are done. In pipeline mode each group
// is scored by the reward server and stored in the replay buffer (on a small
// pool of pipeline threads, so a slow scorer never stalls decoding) before
// it is handed back with stored = true.
//
// Version fencing: a request is admitted into the generator whole and every
// group of it runs on the weights loaded at admission; the version is
// recorded in each trajectory. A weight update (LoadCheckpoint / LoadFromSync)
// first receives the new tensors (while generation goes on), then waits for
// the fence: no new request is admitted, in-flight groups either finish on
// the old weights (on_update = kFinish), or are interrupted and, once the
// weights are swapped, regenerated from their prompt (kAbort) or continued
// from the tokens they had (kPartial: partial rollout, the version switch
// recorded in Trajectory.version_switches, policy_version the oldest); then
// admission resumes.
//
// Back-pressure: at most max_queue requests wait for admission; Submit
// answers RESOURCE_EXHAUSTED beyond that.
//
// Multi-turn rollouts (GenerateRequest.environment): every sample is an
// episode of an environment server. A model turn decodes like any sequence
// until a stop marker or stop token; the environment's answer is awaited on
// an environment thread (other sequences keep decoding), its observation's
// tokens are appended with loss_mask 0 and the next turn is submitted with
// the whole sequence as its prompt (token-in, token-out: nothing is ever
// re-tokenised). Rows for the group's n episodes are reserved at admission.
// Under kFinish a weight update waits for running episodes to end; under
// kPartial the next turn runs on the new weights (a version switch at its
// first token); kAbort refuses multi-turn requests (FAILED_PRECONDITION).
//
// Safe for concurrent use. Callbacks run on the engine thread, a pipeline
// thread or an environment thread and must not call back into the worker.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "actor/tokenizer.h"
#include "environment/client.h"
#include "proto/rollout.pb.h"
#include "replay_buffer/client.h"
#include "reward_server/client.h"

namespace rlmesh::rollout {

struct RolloutWorkerOptions {
  // Name recorded in Provenance.rollout_worker. Default "rollout-0".
  std::string name = "rollout-0";
  // Requests waiting for admission before Submit says RESOURCE_EXHAUSTED.
  // Default 64.
  int64_t max_queue = 64;
  // Sequences decoded at once (KV-cache rows). Default 64.
  int64_t max_batch = 64;
  // Prompt tokens prefilled in one step. Default 8192.
  int64_t max_prefill_tokens = 8192;
  // What a weight update does to in-flight sequences. Default kFinish.
  //   kFinish:  they end on the old weights (recorded with that version).
  //   kAbort:   interrupted and regenerated from the prompt on the new
  //             weights (a sequence never mixes versions).
  //   kPartial: interrupted and continued from their tokens on the new
  //             weights (partial rollout; Trajectory.version_switches).
  enum class OnUpdate { kFinish, kAbort, kPartial };
  OnUpdate on_update = OnUpdate::kFinish;
  // Parameter dtype and device of a loaded checkpoint ("fp32"/"bf16"/"fp16",
  // "cpu"/"cuda[:i]"). Defaults "fp32", "cpu".
  std::string dtype = "fp32";
  std::string device = "cpu";
  // Pipeline threads scoring and storing finished groups. Default 4.
  int pipeline_threads = 4;
  // Threads calling environment servers (multi-turn rollouts); a model
  // turn waiting on its environment holds one. Default 16.
  int environment_threads = 16;
  // Token sent to environment servers ("authorization: Bearer"); empty
  // sends none. Default empty.
  std::string environment_auth_token;
  // Window of the tokens/s figure in GetStatus. Default 10 s.
  absl::Duration rate_window = absl::Seconds(10);
  // Tensor-parallel ranks the policy is split over (rollout/tp_engine.h):
  // one thread each, in lockstep, each holding 1/tp of the weights and of
  // the KV cache; 1 = one whole model. > 1 needs device "cpu", dtype
  // "fp32" and a dense Llama/Qwen model whose heads, KV heads, MLP width
  // and vocabulary divide by it (refused by name at load). Default 1.
  int tensor_parallel = 1;
  // Replay the decode step from CUDA graphs (actor::GeneratorOptions::
  // cuda_graphs). Needs a CUDA device and tensor_parallel 1. Default false.
  bool cuda_graphs = false;

  absl::Status Validate() const;
};

// "finish" / "abort" / "partial" (RolloutConfig.on_update); empty = finish.
absl::StatusOr<RolloutWorkerOptions::OnUpdate> ParseOnUpdate(const std::string& text);

struct LoadResult {
  // Version now loaded.
  int64_t version = 0;
  // Bytes read or received.
  int64_t bytes = 0;
  // Wall time of the whole load including the wait for the fence, seconds.
  double seconds = 0;
};

struct SleepResult {
  // Parameter and receive-buffer bytes released (0 when only the cache went).
  int64_t released_bytes = 0;
  // The worker's memory before and after (dist::ProcessMemoryBytes of its
  // device).
  int64_t memory_before = 0;
  int64_t memory_after = 0;
  // Wall time, the wait for the engine included.
  double seconds = 0;
};

// One submitted Generate call, for cancellation.
class RequestHandle;

class RolloutWorker {
 public:
  // Receives each finished group (in completion order) and whether the
  // replay buffer acknowledged it.
  using GroupSink = std::function<void(TrajectoryGroup group, bool stored)>;
  // Called exactly once after the last group of a request: OK, or the first
  // error (a group that could not be scored/stored after retries is still
  // handed to the GroupSink with stored = false, then the request ends with
  // that error).
  using DoneCallback = std::function<void(absl::Status)>;

  // `tokenizer` is required (provenance hash, decode_text). `reward` and
  // `replay` may be null; pipeline requests then fail with
  // FAILED_PRECONDITION naming --reward_server / --replay_buffer.
  // `environment`, when set, serves every multi-turn request whatever its
  // environment.address (tests); when null the worker connects to each
  // request's address. Not owned; they must outlive the worker.
  RolloutWorker(RolloutWorkerOptions options, std::unique_ptr<actor::Tokenizer> tokenizer,
                RewardClient* reward = nullptr, ReplayBufferClient* replay = nullptr,
                EnvironmentClient* environment = nullptr);
  // Stops the engine: pending and in-flight requests end with CANCELLED.
  // REQUIRES: no method call in progress (the service is destroyed first).
  ~RolloutWorker();
  RolloutWorker(const RolloutWorker&) = delete;
  RolloutWorker& operator=(const RolloutWorker&) = delete;

  // Validates and queues a request. INVALID_ARGUMENT names the field;
  // FAILED_PRECONDITION without weights or pipeline clients; ABORTED when the
  // loaded version is below min_policy_version; RESOURCE_EXHAUSTED when the
  // queue is full. On OK the callbacks will be called.
  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(const GenerateRequest& request, GroupSink on_group,
                                                        DoneCallback on_done);
  // Stops delivering groups of `handle`; its DoneCallback gets CANCELLED.
  void Cancel(const std::shared_ptr<RequestHandle>& handle);

  // Loads, configurations and syncs take turns. Each waits for the one in
  // progress until `deadline` at most, then fails UNAVAILABLE ("retry"): a
  // sync whose publisher never comes holds its turn until the backend's
  // timeout, and must not hold every later caller (and the RPC threads
  // they run on) for as long.
  //
  // Loads a Hugging Face folder; `version` 0 = current + 1, otherwise it must
  // exceed the current version. The first load defines the model shape.
  absl::StatusOr<LoadResult> LoadCheckpoint(const std::string& path, int64_t version,
                                            absl::Time deadline = absl::InfiniteFuture());
  // Joins (or replaces) the weight-sync group.
  absl::Status ConfigureWeightSync(const WeightSyncSpec& spec, absl::Time deadline = absl::InfiniteFuture());
  // The parameters' dtype as the weight sync names it ("f32", "bf16",
  // "f16"): what every sync must carry (a different one is refused).
  std::string WeightDtype() const;
  // Receives `layout` (at least its version; `version` overrides it when
  // non-zero) through the configured group and swaps it in at the fence.
  // REQUIRES: weights loaded once (shape) and ConfigureWeightSync.
  absl::StatusOr<LoadResult> LoadFromSync(const WeightLayout& layout, int64_t version,
                                          absl::Time deadline = absl::InfiniteFuture());

  // Releases memory while the worker is idle: the generator and its KV
  // cache (tensor-parallel ranks free theirs whenever a batch drains), then
  // the allocator's cached blocks (dist::ReleaseCachedMemory). With
  // `release_weights` the policy's parameters (every tensor-parallel rank
  // with its slice) and the weight-sync receive buffers go too; the version
  // and the model's shape stay, Generate is refused (FAILED_PRECONDITION)
  // until a LoadCheckpoint or LoadFromSync, which carries every parameter,
  // brings weights back. FAILED_PRECONDITION while a request is queued or
  // running, or before any load. Takes the load turn like a load.
  absl::StatusOr<SleepResult> Sleep(bool release_weights, absl::Time deadline = absl::InfiniteFuture());

  RolloutStatus Status() const;
  int64_t policy_version() const;

  // Blocks until no request is queued or running, or `timeout` passes.
  bool WaitIdle(absl::Duration timeout) const;

  struct Impl;

 private:
  // LoadFromSync when the sync comes in pieces (ConfigureWeightSync with
  // spec.pieces > 1). REQUIRES: the load turn held.
  absl::StatusOr<LoadResult> LoadPiecesFromSync(const WeightLayout& expected, int64_t version, absl::Time start);

  std::unique_ptr<Impl> impl_;
};

}  // namespace rlmesh::rollout
