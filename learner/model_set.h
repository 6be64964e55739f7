#pragma once

// The model set of one learner shard: the policy, the frozen reference (when
// KL is on, or DPO), the critic (PPO), their DataParallel optimizers and the
// process group they share; built for one stage (LoadPolicy, then
// BuildTrainingModels) and dropped with it.
//
// Not thread-safe: owned by one Trainer and used only by the thread that
// calls it (the tensors are mutated by every training step).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/logprobs.h"
#include "actor/model_config.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "dist/gloo.h"
#include "dist/store.h"
#include "learner/batching.h"
#include "learner/context_parallel.h"
#include "learner/data_parallel.h"
#include "learner/expert_parallel.h"
#include "learner/fully_sharded.h"
#include "learner/pipeline_parallel.h"
#include "learner/stage_options.h"
#include "parallel/tensor_parallel.h"
#include "proto/learner.pb.h"

namespace rlmesh::learner {

struct ModelSet {
  actor::Transformer policy{nullptr};
  // Frozen copy of the stage's initial policy; null when unused.
  actor::Transformer reference{nullptr};
  // PPO's value model (policy weights + a value head); null otherwise.
  actor::Transformer critic{nullptr};
  // On-policy distillation's frozen teacher (rl.distillation.teacher, its
  // own architecture and size); null otherwise.
  actor::Transformer teacher{nullptr};
  // world_size > 1 only: the c10d store and the group of the shards (Gloo
  // on the CPU, NCCL on GPUs: its collectives take tensors on `device`).
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> group;
  // The policy's optimizer (plain DP or ZeRO-1); null under ZeRO-3.
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<DataParallel> critic_dp;
  // learner.zero: 3 with a critic (PPO): the critic fully sharded like the
  // policy (its lm_head frozen; with learner.tp, its slices), with its own
  // optimizer (critic_dp is null); Values on `critic` goes through it.
  // `critic` keeps its config and holds parameter data only on rank 0
  // while a checkpoint writes it (GatherCritic, DropGatheredCritic).
  std::unique_ptr<FullyShardedModel> sharded_critic;
  // learner.tp > 1 with a critic: the critic split like the policy over
  // tp_group (its lm_head frozen); critic_dp steps its slices over
  // dp_group. `critic` holds data as under ZeRO-3.
  std::unique_ptr<parallel::TensorParallelModel> tp_critic;
  // learner.zero: 3 — the policy fully sharded over the group, with its own
  // optimizer (dp is null). With learner.tp > 1 too, each tensor-parallel
  // rank's slices are sharded over `dp_group` (the replicas holding the same
  // slices), the units computing over `tp_group` (learner/fully_sharded.h);
  // tp_policy stays null. The policy's forward and backward passes go
  // through it (LogProbs). `policy` then holds the whole model's weights on
  // rank 0 only, for weight sync and checkpoints: SyncPolicy refreshes them
  // after the optimizer steps. The other ranks' `policy` keeps its config
  // and no parameter data.
  std::unique_ptr<FullyShardedModel> sharded;
  // learner.tp > 1: the policy, and the reference when there is one, split
  // over this replica's tensor-parallel group (`tp_group`: ranks
  // [d*tp, (d+1)*tp) for replica d). `dp` steps the policy's slices over
  // `dp_group`, the ranks that hold the same slices (null when there is one
  // replica), with the gradient norm summed over `tp_group`. As under
  // ZeRO-3, `policy` holds the whole model on rank 0 only (SyncPolicy), and
  // `reference` holds no parameter data. With weight sync in pieces
  // (whole_on_demand) not even rank 0 keeps it between checkpoints.
  std::unique_ptr<parallel::TensorParallelModel> tp_policy, tp_reference;
  c10::intrusive_ptr<c10d::Backend> tp_group, dp_group;
  // learner.ep > 1: the policy's routed experts spread over this rank's
  // expert-parallel group, the rest replicated, with its own optimizer (dp
  // is null). The policy's
  // passes run through ep_policy->model() (LogProbs, PolicyModule); as
  // under TP, `policy` holds the whole model on rank 0 only (SyncPolicy).
  std::unique_ptr<ExpertParallelModel> ep_policy;
  // learner.pp > 1: this rank's stage of its replica's pipeline (`pp_group`:
  // ranks [d*pp, (d+1)*pp) for replica d; with learner.tp > 1 the same
  // tensor-parallel slice of each stage, the slices of a stage in
  // `tp_group`), for the policy and, when there
  // is one, the frozen reference; `dp_group` is the replicas holding the
  // same stage and slice (null for one replica). The steps run their training passes
  // through pp_policy->Train in the pipeline's schedule; LogProbs serves no-grad
  // passes only. As under TP, `policy` holds the whole model on rank 0 only
  // (SyncPolicy), and `reference` no parameter data.
  std::unique_ptr<PipelineModel> pp_policy, pp_reference;
  c10::intrusive_ptr<c10d::Backend> pp_group;
  // Time steps per chunk of the logits in the pipeline's last stage
  // (TrainerOptions.logprob_chunk).
  int64_t logprob_chunk = 64;
  // learner.cp > 1: the policy (and the reference) over this replica's
  // context-parallel group (`cp_group`: rank r is context rank (r / tp) %
  // cp of replica r / (tp * cp), with the ranks of its replica that hold
  // the same tensor-parallel slice), sharing `policy`'s module, or under
  // TP tp_policy's (tp_reference's): each rank runs its zig-zag share of
  // every row's tokens, and LogProbs gives 0 at the other ranks' positions
  // (ContextMask). `dp` steps the policy over every rank (under TP its
  // slices over `dp_group`, the ranks holding the same slices), each rank's
  // local weight its replica's / cp (learner/context_parallel.h);
  // `cp_replicas` is the replicas holding the same share and slices.
  std::unique_ptr<ContextParallelModel> cp_policy, cp_reference;
  // The distillation teacher likewise (whole on every rank, its rows split
  // over `cp_group`).
  std::unique_ptr<ContextParallelModel> cp_teacher;
  c10::intrusive_ptr<c10d::Backend> cp_group, cp_replicas;
  // Context-parallel ranks per replica (1 without).
  int ContextRanks() const { return cp_group ? cp_group->getSize() : 1; }
  // 1 at this rank's positions of [rows, T] inputs (all of them without
  // context parallelism).
  at::Tensor ContextMask(int64_t rows, int64_t T) const;
  // learner.cp > 1: `t` [rows, T], 0 outside this rank's positions, summed
  // over the context-parallel group in place (every position then holds
  // its rank's value); every rank must call it. No-op otherwise.
  absl::Status ShareContextTokens(at::Tensor& t);
  // learner.cp > 1: the sum over the context-parallel group of every rank's
  // `partial` (its positions' share of per-sequence sums, say), whose
  // gradient reaches this rank's own `partial` unchanged; every rank must
  // call it. `partial` itself otherwise.
  absl::StatusOr<at::Tensor> ContextSum(const at::Tensor& partial);
  // learner.cp > 1: the ranks' weighted sums of `means` (and `weight`, if
  // not null) summed over the context-parallel group, so that every rank
  // reports its replica's means; every rank must call it, with the same
  // names. No-op otherwise.
  absl::Status ShareContextMeans(MetricMeans* means, double* weight);
  // Under ZeRO-3, TP or EP: the whole policy's parameter names and shapes, in
  // NamedParameters() order (what plain DP's flat optimizer layout follows:
  // a reward model's lm_head, out of the optimizer, is left out).
  std::vector<std::pair<std::string, std::vector<int64_t>>> policy_shapes;
  // The critic's trained parameters' names and shapes (all but its lm_head),
  // in NamedParameters() order: its moments' flat layout.
  std::vector<std::pair<std::string, std::vector<int64_t>>> critic_shapes;
  // learner.zero: 3 with weight sync in pieces (zero3_sync_slices): this
  // rank's slice r of the group's size of every policy parameter
  // (parallel::TensorParallelPiece's cut, Hugging Face names in
  // NamedParameters() order), what Trainer::PolicyPiece cuts this rank's
  // pieces from. Refreshed after each step by a gather one unit at a time
  // (SyncPolicy) and on a load, so no rank holds the whole policy for
  // weight sync: 1/world of it each.
  std::vector<std::pair<std::string, at::Tensor>> sync_slices;
  // learner.zero: 1. Under TP, each rank's moments (of its ZeRO-1 share of
  // its slices) are its own checkpoint file, like plain ZeRO-1's.
  bool zero1 = false;
  // experiment.model.lora in this stage: the policy trains LoRA adapters
  // (actor/lora.h) only; its base weights are frozen and out of the
  // optimizer (dp steps the adapters: their AdamW moments, checkpointed
  // moments and flat layout are the adapters'). Plain DP and ZeRO-1 only.
  bool lora = false;
  // With lora, the stage's KL reference (RL with rl.kl, DPO) is `policy`
  // itself with its adapters off: `reference` is the same module, and
  // LogProbs on it turns the adapters off for the call. No second model is
  // held.
  bool reference_is_base = false;
  // Forward passes under bf16 autocast (learner.autocast: bf16).
  bool autocast_bf16 = false;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  // The device itself (experiment.model.device, resolved).
  c10::Device device{c10::DeviceType::CPU};

  // Per-token log-probs of `targets` under `m` (autocast as configured;
  // `reference` under reference_is_base: the policy with adapters off).
  absl::StatusOr<actor::TokenLogProbsOutput> LogProbs(actor::Transformer& m, const at::Tensor& ids,
                                                      const at::Tensor& pos, const at::Tensor& targets,
                                                      int64_t chunk, double temperature,
                                                      const at::Tensor& attention_mask = {});
  // The value head's outputs [B, T], fp32 (through the sharded or
  // tensor-parallel policy when `m` is the policy under those layouts).
  // `attention_mask`: as for LogProbs (segment ids of packed rows).
  absl::StatusOr<at::Tensor> Values(actor::Transformer& m, const at::Tensor& ids, const at::Tensor& pos,
                                    const at::Tensor& attention_mask = {});

  // The policy's optimizer, whichever layout holds it (dp or sharded), with
  // DataParallel's convention: ZeroGrad before a step's backward passes, in
  // which each rank's loss is its local mean over `local_weight` units, then
  // Step with the same local weight.
  absl::Status ZeroGradPolicy(double local_weight);
  absl::StatusOr<DataParallelStepStats> StepPolicy(double local_weight, double lr);
  int64_t PolicySteps() const;
  // The critic's optimizer (critic_dp or sharded_critic), with the same
  // convention; no-ops without a critic.
  absl::Status ZeroGradCritic(double local_weight);
  absl::StatusOr<DataParallelStepStats> StepCritic(double local_weight, double lr);
  int64_t CriticSteps() const;
  // The critic's AdamW moments for a checkpoint: plain DP's flat layout
  // (ZeRO-1: this rank's range). Undefined without a critic;
  // FAILED_PRECONDITION under ZeRO-3 and TP without ZeRO-1, whose moments a
  // save gathers as it writes them (learner/trainer_checkpoint.cc).
  absl::StatusOr<std::pair<at::Tensor, at::Tensor>> CriticMoments();
  // Restores them; `whole`: plain DP's layout of the whole critic (ZeRO-1
  // keeps its share), else this rank's own share as saved.
  absl::Status LoadCriticMoments(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t steps,
                                 bool whole);
  // ZeRO-3 and TP: the whole critic gathered into rank 0's `critic` (unit
  // by unit under ZeRO-3; every rank must call it), and dropped again.
  // No-ops otherwise.
  absl::Status GatherCritic();
  void DropGatheredCritic();
  // Reads the critic's weights from the Hugging Face folder `dir` (under
  // ZeRO-3 and TP every rank reads it whole and keeps its part).
  absl::Status LoadCriticWeights(const std::string& dir);
  // Sums `t` over the learner's data-parallel replicas in place (alone:
  // unchanged): the whole group, or under TP, PP and CP the replicas' (a
  // replica's ranks hold the same rows).
  absl::Status AllReduceSum(at::Tensor& t);
  // learner.pp > 1: the last stage's step metrics `m` to every stage of its
  // pipeline (only the last stage computes the loss); every stage must call
  // it. No-op otherwise.
  absl::Status ShareLastStageMetrics(google::protobuf::Map<std::string, double>* m);
  // The largest `n` over the group (alone: n). ZeRO-3 runs as many policy
  // passes on every rank as the rank with the most.
  absl::StatusOr<int64_t> MaxOverGroup(int64_t n);
  // ZeRO-3 and EP: one forward (and, with `backward`, backward) pass of the
  // policy (`with_policy`) and of a sharded critic on a one-token batch
  // whose gradient is zero, so that a rank with fewer micro-batches makes
  // the same collectives as the others. No-op otherwise.
  absl::Status EmptyPolicyPass(bool backward, bool with_policy = true);
  // True when every rank must run as many passes as the others
  // (MaxOverGroup, EmptyPolicyPass): the passes hold collectives.
  bool AlignedPasses() const { return sharded != nullptr || ep_policy != nullptr || sharded_critic != nullptr; }
  // The module the policy's forward passes run through (routing replay and
  // router logits attach to it): ep_policy->model() under EP, else policy.
  actor::Transformer& PolicyModule() { return ep_policy ? ep_policy->model() : policy; }
  // After an optimizer step (every rank must call it). ZeRO-3, TP and EP:
  // gathers the updated weights into rank 0's `policy`; with
  // whole_on_demand, drops rank 0's now stale copy instead (and under
  // ZeRO-3 refreshes sync_slices). No-op otherwise.
  absl::Status SyncPolicy();
  // With zero3_sync_slices: sync_slices cut from the whole policy,
  // gathered unit by unit (every rank must call it), or from `full` (the
  // whole policy's weights, held by this rank). No-op otherwise.
  absl::Status RefreshSyncSlices();
  absl::Status CutSyncSlices(const std::vector<std::pair<std::string, at::Tensor>>& full);
  // learner.tp > 1 or learner.zero: 3 with weight sync in pieces
  // (weight_sync::ConfiguredWeightPieces > 1): the rollout receives each
  // rank's slices from that rank (under ZeRO-3 from sync_slices), so
  // nobody needs the whole policy after a step, and rank 0 keeps none (0.20
  // of K=1's training state, bench/learner_layouts.md). GatherPolicy builds
  // it when a checkpoint asks; the next step drops it. Also a reward model
  // under ZeRO-3 or TP, which is never synced.
  bool whole_on_demand = false;
  // ZeRO-3 with weight sync in pieces (not a reward model): sync_slices
  // are kept.
  bool zero3_sync_slices = false;
  // With whole_on_demand: rank 0's `policy` holds the current weights.
  bool whole_fresh = false;
  // Makes rank 0's `policy` the whole current policy (every rank must call
  // it): a gather under whole_on_demand unless already fresh; a no-op
  // otherwise, where SyncPolicy keeps it current.
  absl::Status GatherPolicy();
  // What SyncPolicy and GatherPolicy share: the split policy gathered into
  // rank 0's `policy` (every rank must call it).
  absl::Status GatherIntoRank0();
  // True when the policy's parameters live split over ranks (ZeRO-3, TP,
  // EP, PP).
  bool PolicySplit() const {
    return sharded != nullptr || tp_policy != nullptr || ep_policy != nullptr || pp_policy != nullptr;
  }
  // The policy's AdamW moments for a checkpoint: plain DP's flat layout
  // (ZeRO-1: this rank's flat range; EP: this rank's parameters').
  // FAILED_PRECONDITION under ZeRO-3 and TP without ZeRO-1, as CriticMoments.
  absl::StatusOr<std::pair<at::Tensor, at::Tensor>> PolicyMoments();
  // Restores them from that layout, with the optimizer's step count. With
  // `whole`, they are plain DP's flat layout of the whole policy under every
  // layout (ZeRO-1 keeps this rank's share): learner/moments_layout.h's
  // ReadWholeMoments, how a checkpoint resumes in another layout.
  absl::Status LoadPolicyMoments(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t steps,
                                 bool whole = false);
  // Reads the policy's weights from the Hugging Face folder `dir` (under
  // ZeRO-3 and TP every rank reads the whole model and keeps its part;
  // rank `rank` 0 also keeps it whole in `policy`).
  absl::Status LoadPolicyWeights(const std::string& dir, int rank);
};

struct LoadedPolicy {
  // The policy's architecture (also the reference's and critic's).
  actor::ModelConfig config;
  // The policy version recorded with init_checkpoint (0 if none): versions
  // increase over the stages of an experiment.
  int64_t policy_version = 0;
};

// Loads the policy from `init_checkpoint` (or experiment.model.path when
// model.init is checkpoint) or builds it from scratch per experiment.model,
// seeded by experiment.seed; a reward-model stage gets a value head. Sets
// models->policy, device_type and autocast_bf16.
absl::StatusOr<LoadedPolicy> LoadPolicy(const ExperimentConfig& experiment, const std::string& init_checkpoint,
                                        const StageOptions& stage, const actor::Tokenizer& tokenizer,
                                        ModelSet* models);

// The rest of the set, after LoadPolicy: reference and critic copied from
// the policy, the distillation teacher loaded from its folder, the process group (world_size > 1, rendezvous at
// `store_address`: "file:/path" or "host:port" of a store another process
// hosts, every rank a client; keys under `store_prefix`) and the optimizers,
// with the parameters broadcast from rank 0.
absl::Status BuildTrainingModels(const ExperimentConfig& experiment, const StageOptions& stage,
                                 const actor::ModelConfig& config, const std::string& store_address,
                                 const std::string& store_prefix, int rank,
                                 int world_size, const dist::GlooGroupOptions& gloo, int64_t store_timeout_ms,
                                 ModelSet* models);

}  // namespace rlmesh::learner
