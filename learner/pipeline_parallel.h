#pragma once

// Pipeline parallelism for the Llama / Qwen2 / Qwen3 family over a c10d
// group of P ranks (Gloo on the CPU), one pipeline stage per rank.
//
// Stage s holds a contiguous run of decoder layers (V runs under the
// interleaved schedule, below); the first stage also
// holds the embedding, the last the final norm and the output head (with
// tied embeddings, a copy of the embedding whose gradient it sums with the
// first stage's before every step, as Megatron does). Layers are balanced by
// parameter count (parallel/layout_shapes.h's BalancedStageLayers, the head
// counted tied or not, since it computes either way), spread evenly over
// the chunks under the interleaved schedule (PipelineChunkLayers), or as
// options.stage_layers says.
// Activations travel forward and their gradients backward point to point
// ([rows, T, hidden] fp32 per micro-batch), sends asynchronous, receives
// blocking.
//
// Train runs a mini-batch's micro-batches in the order
// parallel/pipeline_schedule.h gives: the one-forward-one-backward (1F1B)
// schedule of PipeDream-Flush / Megatron, where stage s first runs
// min(P - 1 - s, M) forwards, then alternates one forward and one backward,
// then drains the backwards, so that it holds at most P - s micro-batches'
// activations (GPipe holds M); or, with options.virtual_stages = V > 1,
// Megatron's interleaved schedule, the model cut into P x V chunks, chunk c
// on stage c % P, which shrinks the bubble by V for more activations in
// flight. The stage holding the model's last chunk scores each
// micro-batch's log-probs and entropies, asks the caller's loss function
// for the loss to backpropagate, and runs the backward at once. Only the
// last stage calls the loss function; every stage makes the same number of
// sends and receives, so every rank must call Train with the same
// micro-batch shapes. Idle time follows the schedule's bubble,
// (P - 1) / (V M + P - 1) of a stage's time with equal stages
// (bench/pipeline_parallel.md).
//
// The optimizer follows DataParallel's convention (learner/data_parallel.h)
// over `options.data_parallel`, the replicas that hold the same stage:
// ZeroGrad, then the backward passes of each rank's local mean, then Step
// with the local weight. The gradient norm (reported, clipped to) is the
// whole model's: each stage's squared norm summed over the pipeline, the
// last stage's tied copy of the embedding counted once. The results equal
// one process holding the whole batch up to floating-point summation order
// (learner/pipeline_parallel_test.cc: 1e-5 in fp32 after three AdamW steps).
// With options.optimizer.zero1, each replica of a stage keeps the AdamW
// state of its share of the stage's parameters (ZeRO-1 over the replicas
// holding the stage).
//
// Checkpoints stay layout-free: GatherFull gives the Hugging Face layout,
// GatherMoments the AdamW moments in DataParallel's flat layout of the whole
// model, and LoadFromFull / LoadMoments take this stage's part of them, so a
// run saved at one P (or one process) resumes at another.
//
// With options.tensor_parallel, each stage is split over its own
// tensor-parallel group as parallel/tensor_parallel.h splits a whole model
// (PP x TP); the gathers join the slices, so the checkpoints and the weight
// sync's whole model are the same as without it.
//
// Limits, refused by name: MoE layers, a value head, bf16, and what
// tensor parallelism refuses (parallel::ValidateTensorParallel).
//
// Collectives: every rank of the pipeline must make the same calls in the
// same order: LogProbs, Train, Step, the gathers. A failed send, receive or
// collective returns ABORTED (the groups are then unusable).
//
// Not thread-safe: one PipelineModel per rank, used by one thread.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/logprobs.h"
#include "actor/model_config.h"
#include "learner/data_parallel.h"
#include "parallel/layout_shapes.h"

namespace rlmesh::learner {

struct PipelineOptions {
  // Model chunks per stage: 1 = the 1F1B schedule, V > 1 = the interleaved
  // schedule over P x V chunks (needs P > 1). Default 1.
  int virtual_stages = 1;
  // Decoder layers per model chunk in model order (chunk c on stage c % P),
  // P x virtual_stages entries, each >= 1, summing to the model's layers.
  // Empty = parallel::PipelineChunkLayers. Default empty.
  std::vector<int64_t> stage_layers;
  // Time steps per chunk of the vocabulary logits on the last stage.
  // Default 128.
  int64_t logprob_chunk = 128;
  // AdamW, gradient clipping and ZeRO-1 over `data_parallel`; the norm
  // groups and weights must stay at their defaults (the pipeline sets its
  // own).
  DataParallelOptions optimizer;
  // The replicas holding this same stage and tensor-parallel slice (null
  // or of size 1: none).
  c10::intrusive_ptr<c10d::Backend> data_parallel;
  // The ranks that hold this same stage, each a tensor-parallel slice of it
  // (null or of size 1: none). With one, the stage's layers, embedding and
  // head are split Megatron-style over it (parallel/tensor_parallel.h: the
  // attention heads, MLP channels and vocabulary), and `pipeline` links the
  // stages' ranks of the same slice: activations and their gradients are
  // replicated over the slices, so slice t of stage s sends to slice t of
  // stage s + 1. Default null.
  c10::intrusive_ptr<c10d::Backend> tensor_parallel;
  // Activation checkpointing: each decoder layer keeps only its input and
  // runs again in the backward pass (under tensor_parallel, its collectives
  // too), so a micro-batch in flight holds one [rows, T, hidden] per layer.
  // Default false.
  bool activation_checkpointing = false;
  // False for a frozen model (a KL reference): no gradient, no optimizer;
  // Train, Step and the moments' calls return FAILED_PRECONDITION. Default
  // true.
  bool trainable = true;
};

// OK when `config` can be split into `stages` x `virtual_stages` chunks of
// `stage_layers` (empty = balanced); INVALID_ARGUMENT or UNIMPLEMENTED
// naming the field otherwise.
absl::Status ValidatePipeline(const actor::ModelConfig& config, int stages,
                              const std::vector<int64_t>& stage_layers = {}, int virtual_stages = 1);

// One micro-batch's inputs, the same on every stage: [rows, T] int64 ids,
// positions and targets (-1 = no target), and an optional attention mask
// as TransformerImpl::ForwardHidden takes it (padding or segment ids).
struct PipelineMicroBatch {
  at::Tensor ids, positions, targets, attention_mask;
};

// What a stage did in one Train call: its operations in order ("F0", "B0",
// ...), the most (micro-batch, chunk) activations it held at once, and the
// seconds it spent computing and waiting for its peers.
struct PipelineTrace {
  std::vector<std::string> ops;
  int64_t max_in_flight = 0;
  double compute_seconds = 0.0;
  double wait_seconds = 0.0;
  double total_seconds = 0.0;
};

class PipelineModel {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;
  // The loss of micro-batch k from its log-probs and entropies (with
  // autograd history): the scalar to backpropagate, already scaled as the
  // caller's convention wants. Called on the last stage only, in order.
  using LossFn = std::function<absl::StatusOr<at::Tensor>(size_t k, const actor::TokenLogProbsOutput& out)>;

  // Stage `pipeline->getRank()` of a model shaped `config` (null pipeline =
  // one stage holding everything). Weights are as the model initialises
  // them (torch::manual_seed first); call LoadFromFull to set them. The
  // whole model is built once and its other stages' parameters freed.
  static absl::StatusOr<std::unique_ptr<PipelineModel>> Create(const actor::ModelConfig& config,
                                                               c10::intrusive_ptr<c10d::Backend> pipeline,
                                                               const PipelineOptions& options = {});
  ~PipelineModel();
  PipelineModel(const PipelineModel&) = delete;
  PipelineModel& operator=(const PipelineModel&) = delete;

  // Sets this stage's parameters from the whole model's (Hugging Face
  // names; a tied lm_head absent). INVALID_ARGUMENT naming a missing or
  // misshapen parameter.
  absl::Status LoadFromFull(const Named& full);

  // Per-token log-probs and entropies of each micro-batch, [rows, T] fp32,
  // without gradient, on every stage (the last stage broadcasts them).
  // INVALID_ARGUMENT for bad inputs (before any send); ABORTED when a
  // transfer fails.
  absl::StatusOr<std::vector<actor::TokenLogProbsOutput>> LogProbs(const std::vector<PipelineMicroBatch>& micro,
                                                                   double temperature);

  // One mini-batch's forward and backward passes in the pipeline's
  // schedule, accumulating into this stage's gradients (ZeroGrad first).
  // `trace`, if not null, receives what this stage did ("F3" / "B3" for
  // micro-batch 3; "F3.1" for its pass through chunk 1 when interleaved). The first error `loss` returns
  // on the last stage is returned there; the other stages then fail with
  // ABORTED at the pipeline's timeout.
  absl::Status Train(const std::vector<PipelineMicroBatch>& micro, double temperature, const LossFn& loss,
                     PipelineTrace* trace = nullptr);

  // DataParallel's convention over the replicas of this stage; Step first
  // sums the tied embedding's gradient between the first and last stages.
  void ZeroGrad();
  absl::StatusOr<DataParallelStepStats> Step(double local_weight, double lr);

  // The whole model's weights under Hugging Face names in NamedParameters()
  // order, on every stage (each stage broadcasts its own). ABORTED when a
  // collective fails.
  absl::StatusOr<Named> GatherFull();
  // The same on the first stage only (under tensor parallelism its slice 0:
  // rank 0 of the replica), each stage sending its own parameters there
  // point to point (weight sync: no other stage holds the whole model); the
  // other ranks get an empty list.
  absl::StatusOr<Named> GatherToFirst();
  // AdamW's moments, (exp_avg, exp_avg_sq), in DataParallel's flat layout of
  // the whole model (NamedParameters() order), on every stage (under ZeRO-1
  // gathered over the replicas first: every rank must call it).
  absl::StatusOr<std::pair<at::Tensor, at::Tensor>> GatherMoments();
  // Sets this stage's moments (under ZeRO-1 this rank's share of them) from
  // the whole model's in that layout. INVALID_ARGUMENT when the sizes
  // differ from the whole model's.
  absl::Status LoadMoments(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t steps);
  int64_t steps() const;

  // This stage's trained parameters under Hugging Face names (the last
  // stage's tied copy of the embedding excluded; slices under tensor
  // parallelism).
  Named StageParameters() const;
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  // This rank's tensor-parallel slice of its stage (0 without).
  int tensor_parallel_rank() const;
  // This stage's chunks' decoder layers, [begin, end) each (one run under
  // 1F1B).
  std::vector<std::pair<int64_t, int64_t>> chunk_layers() const;
  const actor::ModelConfig& config() const { return config_; }

 private:
  struct Impl;
  PipelineModel() = default;

  actor::ModelConfig config_;
  int stage_ = 0;
  int stages_ = 1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlmesh::learner
