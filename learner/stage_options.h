#pragma once

// Stage options: what one stage of an experiment asks of the learner, read
// from an ExperimentConfig that NormalizeExperiment (schema/experiment.h)
// has checked and defaulted, so the training steps
// switch on an enum and read plain fields instead of strings and protos.
// The normaliser is the one place that validates the config; these
// functions only convert it, plus the checks that need the learner's own
// world (the batch against the data-parallel replicas). Errors are
// INVALID_ARGUMENT naming the config field ("experiment.stages[1].grpo.rl.
// optimizer.lr: must be in (0, 1)").
//
// Plain values; no thread-safety concerns.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "actor/model_config.h"
#include "learner/advantages.h"
#include "learner/distillation.h"
#include "learner/losses.h"
#include "learner/mismatch.h"
#include "learner/schedule.h"
#include "proto/learner.pb.h"

namespace rlmesh::learner {

enum class StageKind { kSft, kRewardModel, kDpo, kGrpo, kPpo };

// "sft", "reward_model", "dpo", "grpo", "ppo": the config's field name, also
// what checkpoints record as trainer_state.json's stage_kind.
absl::string_view StageKindName(StageKind kind);

// The RL advantage estimator (grpo.advantage; PPO always uses GAE).
enum class Advantage { kGrpo, kDrGrpo, kRloo, kReinforcePp, kPpo };

// One optimizer: AdamW, its LR schedule and gradient clipping.
struct OptimizerOptions {
  AdamWOptions adamw;
  LrScheduleOptions schedule;
  // Global gradient-norm clip; < 0 (config -1): no clipping. Default 1.0.
  double grad_clip = 1.0;
};

// A normalised OptimizerConfig -> options for `total_steps` optimizer steps.
OptimizerOptions MakeOptimizerOptions(const OptimizerConfig& config, int64_t total_steps);

// Learner-wide settings of the experiment (experiment.learner, checkpoint,
// and the rollout sampling the learner must reproduce).
struct LearnerSettings {
  // learner.zero == 1: ZeRO-1 sharded optimizer state. Default false.
  bool zero1 = false;
  // learner.zero: 3 — the policy's parameters, gradients and optimizer state
  // fully sharded (learner/fully_sharded.h).
  bool zero3 = false;
  // learner.tp: tensor-parallel ranks per replica (parallel/tensor_parallel.h);
  // the learner's world_size / tp replicas split the data. Default 1.
  int tp = 1;
  // learner.sequence_parallel (tp > 1 only). Default false.
  bool sequence_parallel = false;
  // learner.ep: expert-parallel ranks per group (learner/expert_parallel.h);
  // the world size / ep groups hold the same experts, and every rank trains
  // its own rows. Default 1.
  int ep = 1;
  // learner.pp: pipeline stages per replica (learner/pipeline_parallel.h);
  // the world size / (tp x pp) replicas split the data. Default 1.
  int pp = 1;
  // learner.pp_microbatches: with pp > 1, the fewest micro-batches per
  // mini-batch. Default 0 (set to 2 x pp by the schema).
  int pp_microbatches = 0;
  // learner.pp_layers: decoder layers per chunk; empty = balanced.
  std::vector<int64_t> pp_layers;
  // learner.pp_virtual_stages: model chunks per stage, > 1 under the
  // interleaved schedule. Default 1.
  int pp_virtual_stages = 1;
  // learner.cp: context-parallel ranks per replica
  // (learner/context_parallel.h), splitting each row's tokens. Default 1.
  int cp = 1;
  // The ranks that train one replica's rows: tp x pp x cp.
  int RanksPerReplica() const { return tp * pp * cp; }
  // Most padded tokens in one micro-batch. Default 8192.
  int64_t micro_tokens = 8192;
  // learner.autocast == "bf16": forward passes under bf16 autocast.
  bool autocast_bf16 = false;
  // learner.gradient_checkpointing: the trained models recompute each
  // decoder block in the backward pass (actor::TransformerImpl::
  // set_activation_checkpointing). Default false.
  bool gradient_checkpointing = false;
  // learner.sleep == "cache": each train step ends by handing the
  // allocator's free memory back (dist::ReleaseCachedMemory). Default false.
  bool release_memory_after_step = false;
  // Sampling temperature of the rollout: on-policy ratios are exactly 1 only
  // if log-probs are recomputed at it. Default 1.0 (also for greedy).
  double temperature = 1.0;
  // rollout.sampling.max_new_tokens; 0 = unset.
  int max_new_tokens = 0;
  // Step checkpoints kept by Save(""). Default 3.
  int checkpoint_keep = 3;
};

// An SFT stage.
struct SftOptions {
  // Optimizer steps in the stage (> 0).
  int64_t steps = 0;
  // Global batch of examples (>= the learner world size).
  int batch = 0;
  // Also train on the prompt's tokens. Default false.
  bool train_on_prompt = false;
  // Pack the sequences into rows of max_positions tokens. Default false.
  bool packing = false;
  OptimizerOptions optimizer;
};

// A reward-model or DPO stage: trains on preference pairs.
struct PairOptions {
  // Optimizer steps in the stage (> 0).
  int64_t steps = 0;
  // Global batch of pairs (>= the learner world size).
  int batch = 0;
  // DPO's beta. Default 0.1.
  double beta = 0.1;
  // Pairs file (JSONL); "" = pairs made from the task's train split.
  std::string pairs_path;
  // Reward model: the folder the final model is written to; "" = none.
  std::string output;
  OptimizerOptions optimizer;
};

// A GRPO-family or PPO stage.
struct RlOptions {
  Advantage advantage = Advantage::kGrpo;
  // Steps of the stage (> 0); each runs epochs x mini_batches optimizer steps.
  int64_t steps = 0;
  // Passes over each step's batch. Default 1.
  int epochs = 1;
  // Optimizer steps per pass. Default 1.
  int mini_batches = 1;
  PolicyLossOptions loss;
  // KL against the frozen reference: coefficient (0 = no reference), in the
  // reward or in the loss, and the estimator.
  double kl_coef = 0.0;
  bool kl_in_reward = false;
  KlEstimator kl_estimator = KlEstimator::kK3;
  // Drop groups whose rewards are all equal. Default false.
  bool drop_zero_variance = false;
  // Dynamic sampling with refill: the coordinator generated extra groups
  // for this step; the learner keeps the first `refill_groups` groups (by
  // group id) of nonzero reward variance out of the whole global batch and
  // drops the rest. 0 = no refill. (Implies drop_zero_variance.)
  int64_t refill_groups = 0;
  // Rollout/learner mismatch correction from the stored behaviour log-probs.
  MismatchOptions mismatch;
  // Mask responses that stopped at max_new_tokens out of the loss.
  // Default false.
  bool overlong_filter = false;
  // DAPO overlong shaping: tokens before max_new_tokens where the penalty
  // starts (0 = off), and the penalty at max_new_tokens.
  int overlong_buffer = 0;
  double overlong_penalty = 0.0;
  // PPO only: GAE, value clipping and the value-loss weight.
  GaeOptions gae;
  double value_clip = 0.2;
  double vf_coef = 0.5;
  OptimizerOptions optimizer;
  // PPO only: the critic's optimizer (ppo.critic_optimizer, else rl.optimizer).
  OptimizerOptions critic_optimizer;
  // MoE (rl.routing_replay, rl.router_aux_loss_coef): replay the rollout's
  // experts (Trajectory.routes) in the policy's forward passes; the weight
  // of the router's load-balancing loss added to the policy loss (0 = off).
  // `router_aux_loss_coef` is final only after ResolveMoeSettings (until
  // then -1 stands for "unset: the policy's config.json decides").
  bool routing_replay = false;
  double router_aux_loss_coef = -1;
  // On-policy distillation (rl.distillation; GRPO-family stages only).
  DistillationOptions distill;
};

// One stage, validated. Only the member of `kind`'s family is meaningful.
struct StageOptions {
  StageKind kind = StageKind::kSft;
  // stage.name, or the kind's name.
  std::string name;
  // "experiment.stages[<i>]": the prefix of this stage's config fields.
  std::string field;
  LearnerSettings learner;
  SftOptions sft;
  PairOptions pairs;
  RlOptions rl;

  bool is_pairs() const { return kind == StageKind::kRewardModel || kind == StageKind::kDpo; }
  bool is_rl() const { return kind == StageKind::kGrpo || kind == StageKind::kPpo; }
  // The policy's optimizer, whichever the family.
  const OptimizerOptions& optimizer() const {
    return kind == StageKind::kSft ? sft.optimizer : is_pairs() ? pairs.optimizer : rl.optimizer;
  }
};

// Normalises `exp` for a learner of `world_size` processes: sets
// learner.shards to it, then NormalizeExperiment, with errors prefixed
// "experiment.". The coordinator sends normalised configs; this refuses a
// config that did not come through it the same way, and is a no-op on one
// that did.
absl::Status NormalizeForLearner(ExperimentConfig* exp, int world_size);

// Reads experiment.learner, checkpoint.keep, the rollout sampling and
// experiment.stages[stage_index] for a learner of `shards` processes.
// REQUIRES: NormalizeForLearner(&exp, shards) returned OK; stage_index is
// inside experiment.stages.
absl::StatusOr<StageOptions> MakeStageOptions(const ExperimentConfig& experiment, int stage_index,
                                              int shards);

// Once the policy is loaded: refuses rl.routing_replay and a set
// rl.router_aux_loss_coef for a policy without MoE layers (INVALID_ARGUMENT
// naming the field), and resolves an unset router_aux_loss_coef from the
// policy's config.json as transformers does (router_aux_loss_coef when
// output_router_logits, else 0). No-op outside RL stages.
absl::Status ResolveMoeSettings(const actor::ModelConfig& policy, StageOptions* stage);

// Prefixes a non-OK status's message with "<prefix>.".
absl::Status PrefixStatus(const std::string& prefix, const absl::Status& status);

}  // namespace rlmesh::learner
