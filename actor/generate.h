#pragma once

// Batched autoregressive generation with a KV cache and continuous batching:
// prompts of different lengths share a batch, finished sequences leave it and
// queued prompts join between decode steps. Every sample draws its random
// numbers from its own stream keyed by (seed, prompt_index, sample_index), so a
// seeded request gives the same tokens whatever else is in the batch (up to
// floating-point differences of batched kernels, which are ulp-sized).
//
// Not thread-safe: one thread submits and steps a Generator.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/model_config.h"
#include "actor/transformer_fwd.h"

namespace rlmesh::actor {

struct SamplingOptions {
  // Always pick the most likely token; temperature/top_k/top_p are ignored and
  // behaviour log-probs use temperature 1. Default false.
  bool greedy = false;
  // Softmax temperature; > 0. Behaviour log-probs are log softmax(logits /
  // temperature) at the sampled token (before top-k/top-p). Default 1.
  float temperature = 1.0f;
  // Keep only the k most likely tokens; 0 disables. Default 0.
  int top_k = 0;
  // Keep the smallest most-likely set with probability >= top_p; 1 disables.
  // In (0, 1]. Default 1.
  float top_p = 1.0f;
  // Most tokens to generate per sample; > 0. Default 16.
  int max_new_tokens = 16;
  // Generation stops after sampling one of these (the stop token is kept).
  std::vector<int64_t> stop_token_ids;
  // Generation also stops once the completion ends with one of these token
  // sequences (kept; finish reason kStop). Multi-turn rollouts stop a model
  // turn at a tool-call marker this way. Each must be non-empty.
  std::vector<std::vector<int64_t>> stop_sequences;
  // Seed of the request. Default 0.
  uint64_t seed = 0;
  // Samples per prompt; > 0. Default 1.
  int n = 1;

  absl::Status Validate() const;
};

enum class FinishReason {
  kStop,     // sampled a stop token
  kLength,   // max_new_tokens reached
  kContext,  // prompt + completion reached the model's max_positions
  kAborted,  // interrupted by Generator::Abort(): the tokens so far
};
const char* FinishReasonName(FinishReason r);

struct Completion {
  int sample_index = 0;
  std::vector<int64_t> tokens;
  // Behaviour log-prob of each token (see SamplingOptions.temperature).
  std::vector<float> logprobs;
  FinishReason finish_reason = FinishReason::kLength;
  // With GeneratorOptions.record_routing or the request's record_routing on
  // an MoE model: the experts each
  // position chose, [position][moe layer][k] flattened, for the positions the
  // model ran: the prompt and every token but the last (a resumed sample's
  // earlier positions as its re-prefill routed them). The learner replays
  // them (MoeRouting.replay) to score on the rollout's experts. Else empty.
  std::vector<int32_t> routes;
};

struct GenerationRequest {
  // Caller's id, echoed in the result.
  uint64_t id = 0;
  // Prompt token ids; non-empty, each in [0, vocab_size).
  std::vector<int64_t> prompt;
  SamplingOptions sampling;
  // Key of the random streams (with seed and sample index); -1 = the order in
  // which the Generator received the request. Set it to make a sample's
  // tokens independent of what else was submitted. Default -1.
  int64_t prompt_index = -1;
  // Partial rollout: empty, or the n samples of this request as an earlier
  // Abort() returned them (sample_index order). A sample whose finish reason
  // is not kAborted is final and reported as is; a kAborted one continues
  // from its tokens: prompt + tokens are prefilled under the current weights,
  // its random stream resumes where it stopped, and its earlier tokens keep
  // their log-probs (they were sampled by the earlier weights).
  std::vector<Completion> resume;
  // Record this request's MoE routing in Completion.routes (as
  // GeneratorOptions.record_routing does for every request). Default false.
  bool record_routing = false;
};


struct GroupResult {
  uint64_t id = 0;
  int64_t prompt_index = 0;
  // All n samples, ordered by sample_index.
  std::vector<Completion> samples;
};

using GroupCallback = std::function<void(GroupResult)>;

struct GeneratorOptions {
  // Most sequences decoding at once (KV-cache rows). Default 64.
  int64_t max_batch = 64;
  // Most prompt tokens prefilled in one step (bounds the join burst); at least
  // one request is always admitted. Default 8192.
  int64_t max_prefill_tokens = 8192;
  // Record each sample's MoE routing in Completion.routes (no effect on a
  // dense model). Default false.
  bool record_routing = false;
  // Decode at fixed shapes (actor/fixed_decode.h): the running rows padded
  // to a power of two (at most max_batch), attending over the KV cache's
  // whole capacity. That is what a CUDA graph replays; alone it only costs
  // the padding. Dense models with static RoPE only: an MoE model's routing
  // and dynamic RoPE have data-dependent shapes, and decode as usual.
  // Default false.
  bool static_decode = false;
  // Replay each batch bucket's decode step as a CUDA graph (static_decode's
  // shapes), captured on its first step and again when the cache grows.
  // Needs a dense model with static RoPE on a GPU (Submit refuses the
  // others by name); a step that cannot be captured fails the Step, naming
  // rollout.cuda_graphs: decoding never goes on without the graphs asked
  // for. Default false.
  bool cuda_graphs = false;

  absl::Status Validate() const;
};

// What the decode step's CUDA graphs have done (GeneratorOptions::cuda_graphs).
struct DecodeGraphStats {
  int64_t captures = 0;
  int64_t replays = 0;
  // Why graphs were given up ("" while they work or are off).
  std::string error;
};

// The copies between the host and the model's device that the generation
// loop makes. On a GPU each one is a synchronisation: a device->host copy
// waits for every kernel queued before it, and a copy from pageable host
// memory waits for the host. So the loop sends what a step needs (the fed
// tokens, lengths, uniforms) in one copy and reads what the host needs back
// (tokens, log-probs, MoE routes) in one copy: one each way per decode step,
// and one each way per admission (a prefill batch, which also sends the
// joining rows' sampling options; those stay on the device while the rows
// run). With static_decode, FixedShapeDecoder::Step sends the ids and the
// lengths itself, two more host->device copies per step, counted here too.
// Counted on every device, the CPU included (where the copies are no-ops),
// so that tests hold the loop to it.
struct DecodeTransfers {
  // Decode steps (one token for every running row) and admissions.
  int64_t decode_steps = 0;
  int64_t admissions = 0;
  // Copies host->device and device->host, of both kinds of step.
  int64_t host_to_device = 0;
  int64_t device_to_host = 0;
};

// What the Generator needs of a model: prefill and decode over a KV cache,
// and logits over the whole vocabulary. TransformerGeneration wraps an
// actor::Transformer; a tensor-parallel rank implements it over its slice
// (its own KV heads, logits gathered over the ranks: rollout/tp_engine.h).
// Called from the Generator's thread only.
class GenerationModel {
 public:
  virtual ~GenerationModel() = default;
  virtual const ModelConfig& config() const = 0;
  // Where the model's tensors live (inputs are moved there).
  virtual c10::Device device() const = 0;
  // TransformerImpl::Prefill and DecodeStep: final hidden states, the cache
  // filled / extended.
  virtual at::Tensor Prefill(const at::Tensor& ids, const at::Tensor& lens, int64_t capacity,
                             KvCache* cache) = 0;
  virtual at::Tensor DecodeStep(const at::Tensor& ids, const at::Tensor& lens, int64_t max_len,
                                KvCache* cache) = 0;
  // Logits [N, vocab_size] of hidden states [N, H].
  virtual at::Tensor Logits(const at::Tensor& hidden) = 0;
  // The MoE routing record of the next calls (null = none); a model that
  // cannot record routing ignores it and reports no MoE layers.
  virtual void set_routing(MoeRouting* routing) = 0;
};

// An actor::Transformer as a GenerationModel (shared, not copied).
class TransformerGeneration : public GenerationModel {
 public:
  explicit TransformerGeneration(std::shared_ptr<TransformerImpl> model);
  ~TransformerGeneration() override;
  const ModelConfig& config() const override;
  c10::Device device() const override { return device_; }
  at::Tensor Prefill(const at::Tensor& ids, const at::Tensor& lens, int64_t capacity, KvCache* cache) override;
  at::Tensor DecodeStep(const at::Tensor& ids, const at::Tensor& lens, int64_t max_len, KvCache* cache) override;
  at::Tensor Logits(const at::Tensor& hidden) override;
  void set_routing(MoeRouting* routing) override;

 private:
  std::shared_ptr<TransformerImpl> model_;
  c10::Device device_{c10::kCPU};
};

// What drives generation: a Generator, or several in lockstep over a split
// model (rollout/tp_engine.h). See Generator for each call's contract.
class GenerationEngine {
 public:
  virtual ~GenerationEngine() = default;
  virtual absl::Status Submit(GenerationRequest request) = 0;
  virtual bool Idle() const = 0;
  virtual absl::Status Step(const GroupCallback& on_group) = 0;
  virtual int64_t running() const = 0;
  virtual std::vector<GroupResult> Abort() = 0;
  // The decode step's CUDA graphs so far (none unless cuda_graphs).
  virtual DecodeGraphStats graph_stats() const { return {}; }
};

class Generator final : public GenerationEngine {
 public:
  // `model` is shared, not copied; it must outlive the Generator and not be
  // trained while a step runs.
  Generator(Transformer model, GeneratorOptions options = {});
  Generator(std::shared_ptr<GenerationModel> model, GeneratorOptions options = {});
  ~Generator();

  // Queues a request. INVALID_ARGUMENT names the field (empty prompt, token
  // out of range, n > max_batch, bad sampling options).
  absl::Status Submit(GenerationRequest request) override;

  // No queued or running work.
  bool Idle() const override;
  // Admits queued requests that fit, then decodes one token for every running
  // sequence; `on_group` receives each group as soon as all its samples end.
  absl::Status Step(const GroupCallback& on_group) override;
  // Steps until idle.
  absl::Status RunUntilIdle(const GroupCallback& on_group);
  // Submits all, runs until idle, returns groups in request order.
  // REQUIRES: Idle() (else FAILED_PRECONDITION).
  absl::StatusOr<std::vector<GroupResult>> Generate(std::vector<GenerationRequest> requests);

  // Sequences decoding now (for tests and metrics).
  int64_t running() const override;
  // The decode step's CUDA graphs so far.
  DecodeGraphStats graph_stats() const override;
  // The host<->device copies so far.
  DecodeTransfers transfers() const;

  // Stops everything: every queued or running request comes back as a group
  // of all its n samples, finished ones as they ended and the others with
  // finish reason kAborted and their tokens so far; the Generator is then
  // idle. Submit the groups again with `resume` set to continue them (on
  // other weights, in another Generator).
  std::vector<GroupResult> Abort() override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Picks one token per row from logits [N,V] (fp32) for per-row options and
// uniforms u [N] in [0,1): greedy rows take the argmax; others sample by
// inverse CDF from softmax(logits/temperature) restricted by top-k/top-p.
// Returns tokens [N] int64 and behaviour log-probs [N] fp32. Exposed for
// tests.
void SampleTokens(const at::Tensor& logits, const std::vector<const SamplingOptions*>& options,
                  const std::vector<double>& uniforms, std::vector<int64_t>* tokens, std::vector<float>* logprobs);

// The filtered, renormalised distribution SampleTokens draws from for one
// row (greedy: one-hot at the argmax); [V] fp32. Exposed for tests.
at::Tensor SamplingDistribution(const at::Tensor& logits_row, const SamplingOptions& options);

}  // namespace rlmesh::actor
