#pragma once

// Will it fit? The memory each role of an experiment needs, from the
// model's shape, the stages and the layout, against the memory of the
// device it runs on: what `coordinator plan` prints (and `run --dry-run`
// for a local run). Pure arithmetic, no LibTorch.
//
// The learner's terms are the theory bench/learner_memory.md,
// bench/learner_layouts.md and bench/memory_plan.md measure (fp32 masters,
// P the parameters a rank holds: the whole model, a tensor-parallel slice,
// a pipeline stage's layers):
//   weights 4 P, DataParallel's flat weights and gradients 8 P, AdamW's
//   moments 8 P (ZeRO-1: 8 P / dp, plus the rank's shard of gradients and
//   weights, 8 P / dp, dp the ranks holding the same slice or stage), the
//   parameters' gradients 4 P; ZeRO-3 holds 24 P / dp;
//   rank 0 keeps the whole policy (4 B a parameter) for weight sync under
//   ZeRO-3, TP and PP, unless the weights travel in pieces
//   (weight_sync/pieces.h), when ZeRO-3's ranks keep 1/shards of it each;
//   a frozen reference 4 P (RL with kl.coef > 0, DPO); PPO's critic its own
//   state and activations;
//   activations of one micro-batch of N tokens in R rows (N = the stage's
//   sequences per replica x the longest training sequence, at most
//   learner.micro_batch_tokens, and under PP at most 1/pp_microbatches of
//   the mini-batch): N x L x 4 x (9H + 4KV + 4I + A + 4) in the layers
//   (with activation checkpointing each layer keeps its input, 4H per
//   token, and one layer is recomputed at a time), N x 4 x 3H around them,
//   and eight [R, 64, V] fp32 tensors of the log-prob chunk's backward
//   (actor/logprobs.cc: the recomputed logits, log p, p, the gradient and
//   its temporaries). Under TP the heads, KV heads, MLP width and
//   vocabulary are the slice's, and the vocabulary-parallel log-softmax
//   holds four [N, V / tp] fp32 tensors instead of the chunks; under CP a
//   rank runs N / cp tokens and holds one layer's gathered keys and values
//   and their gradients (4 x N x A x D x 4 B); under PP a stage runs its L
//   layers on min(pp - s, M) micro-batches at once (1F1B), and only the
//   last scores the vocabulary.
// A rollout worker holds the weights (fp32), a KV cache of
// rollout.max_batch sequences of the longest generated sequence, and a
// batch of logits. Every process on the host adds the runtime it starts
// with (LibTorch).
// Expert parallelism and tensor-parallel rollout are not planned
// (UNIMPLEMENTED, by field).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/model_config.h"
#include "nlohmann/json.hpp"
#include "proto/config.pb.h"

namespace rlmesh {

// The memory of the devices the roles run on. Bytes.
struct PlanCapacity {
  // This host's memory: the roles of a local run share it. Must be > 0.
  double host_bytes = 0;
  // Memory of each GPU; 0 = unknown (GPU roles are planned, not checked).
  double gpu_bytes = 0;
  // Resident memory of a role process that has loaded LibTorch and its
  // libraries, before any model. Default 135 MiB: idle learners, rollout
  // workers and reward servers measured 127-131 MiB on a 2-core x86 VM
  // (bench/memory_plan.md).
  double runtime_bytes = 135.0 * (1 << 20);
  // The replay buffer process before it holds data (no LibTorch). Default
  // 28 MiB, measured as above; RocksDB's memtables and cache come on top.
  double replay_buffer_bytes = 28.0 * (1 << 20);

  absl::Status Validate() const;
};

// The longest sequences, in tokens; 0 = model.max_positions (the bound).
struct PlanSequences {
  // A training row: the longest prompt plus the longest target (SFT) or
  // rollout.sampling.max_new_tokens (RL), whichever stages there are.
  int64_t train = 0;
  // A generated row: the longest prompt plus max_new_tokens.
  int64_t generate = 0;
};

struct MemoryPart {
  std::string name;
  double bytes = 0;
};

// One kind of process: `count` of them on `device`, each needing `parts`.
struct RoleMemory {
  // "learner", "learner 0" (rank 0 holding the gathered policy), "learner
  // stage 1" (a pipeline stage's ranks), "rollout_worker", ...
  std::string role;
  std::string device;  // "cpu" or "cuda:<i>"
  int count = 1;
  std::vector<MemoryPart> parts;

  double Each() const;
};

struct DeviceUse {
  std::string device;
  double used = 0;
  double capacity = 0;  // 0 = unknown
};

struct MemoryPlan {
  int64_t parameters = 0;
  // Tokens of the largest micro-batch a learner rank trains on, and its rows.
  int64_t micro_batch_tokens = 0;
  int64_t micro_batch_rows = 0;
  std::vector<RoleMemory> roles;
  std::vector<DeviceUse> devices;
};

// REQUIRES: `experiment` normalized (NormalizeExperiment); `model` the
// policy's shape (config.json of model.path, or the scratch sizes with the
// tokenizer's vocabulary).
absl::StatusOr<MemoryPlan> PlanMemory(const ExperimentConfig& experiment, const actor::ModelConfig& model,
                                      const PlanSequences& sequences, const PlanCapacity& capacity);

// The table a person reads.
std::string FormatMemoryPlan(const MemoryPlan& plan);
nlohmann::json MemoryPlanJson(const MemoryPlan& plan);

// RESOURCE_EXHAUSTED naming each device whose roles need more than it has,
// and those roles; OK when everything fits or a capacity is unknown.
absl::Status CheckMemoryPlan(const MemoryPlan& plan);

}  // namespace rlmesh
