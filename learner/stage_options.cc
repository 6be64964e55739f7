#include "learner/stage_options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/proto_yaml.h"
#include "common/status_macros.h"
#include "schema/experiment.h"

namespace rlmesh::learner {
namespace {

// The global batch of an SFT/RM/DPO stage at `field` against the learner
// world this process runs in (the config cannot know it).
absl::Status CheckBatch(const std::string& field, int64_t batch, int world_size) {
  if (batch < world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".batch: must be >= the learner's data-parallel replicas (", world_size, ")"));
  }
  return absl::OkStatus();
}

// What the supervised stages share (SftOptions, PairOptions from an SFT,
// reward-model or DPO stage `s` at `field`): steps, batch (checked by
// CheckBatch) and an optimizer for the stage's steps.
template <typename StageConfig, typename Options>
absl::Status ReadSupervisedStage(const std::string& field, const StageConfig& s, int world_size, Options* o) {
  RLMESH_RETURN_IF_ERROR(CheckBatch(field, s.batch(), world_size));
  o->steps = s.steps();
  o->batch = s.batch();
  o->optimizer = MakeOptimizerOptions(s.optimizer(), s.steps());
  return absl::OkStatus();
}

LearnerSettings MakeLearnerSettings(const ExperimentConfig& exp) {
  const LearnerConfig& lc = exp.learner();
  LearnerSettings l;
  l.zero1 = lc.zero() == 1;
  l.zero3 = lc.zero() == 3;
  l.tp = lc.tp();
  l.sequence_parallel = lc.sequence_parallel();
  l.ep = lc.ep();
  l.pp = std::max(1, lc.pp());
  l.pp_microbatches = lc.pp_microbatches();
  l.pp_layers.assign(lc.pp_layers().begin(), lc.pp_layers().end());
  l.pp_virtual_stages = std::max(1, lc.pp_virtual_stages());
  l.cp = std::max(1, lc.cp());
  l.micro_tokens = lc.micro_batch_tokens();
  l.autocast_bf16 = lc.autocast() == "bf16";
  l.gradient_checkpointing = lc.gradient_checkpointing();
  l.release_memory_after_step = lc.sleep() == "cache";
  l.checkpoint_keep = exp.checkpoint().keep();
  l.temperature = exp.rollout().sampling().temperature();
  l.max_new_tokens = exp.rollout().sampling().max_new_tokens();
  return l;
}

absl::StatusOr<Advantage> ParseAdvantage(const std::string& name) {
  if (name == "grpo") return Advantage::kGrpo;
  if (name == "dr_grpo") return Advantage::kDrGrpo;
  if (name == "rloo") return Advantage::kRloo;
  if (name == "reinforce_pp") return Advantage::kReinforcePp;
  return absl::InvalidArgumentError(absl::StrCat("advantage: \"", name, "\" is not grpo, dr_grpo, rloo or reinforce_pp"));
}

// The fields every RL stage shares (`rl`, "...grpo.rl").
absl::Status ReadRlConfig(const RlStage& rl, const LearnerSettings& learner, RlOptions* o) {
  o->steps = rl.steps();
  o->epochs = rl.epochs();
  o->mini_batches = rl.mini_batches();
  o->optimizer = MakeOptimizerOptions(rl.optimizer(), static_cast<int64_t>(rl.steps()) * o->epochs * o->mini_batches);
  RLMESH_ASSIGN_OR_RETURN(o->loss.kind, ParsePolicyLoss(rl.policy_loss()));
  o->loss.clip_low = rl.clip_low();
  o->loss.clip_high = rl.clip_high();
  o->loss.dual_clip = rl.dual_clip();
  RLMESH_ASSIGN_OR_RETURN(o->mismatch.mode, ParseMismatchMode(rl.mismatch().mode()));
  RLMESH_ASSIGN_OR_RETURN(o->mismatch.level, ParseMismatchLevel(rl.mismatch().level()));
  o->mismatch.low = rl.mismatch().low();
  o->mismatch.high = rl.mismatch().high();
  // The loss's own cap is the tis cap (PolicyLoss uses it only when called
  // with behaviour log-probs and no precomputed weight).
  o->loss.importance_cap = o->mismatch.mode == MismatchMode::kTis ? o->mismatch.high : 2.0;
  o->loss.entropy_coef = rl.entropy_coef();
  o->kl_coef = rl.kl().coef();
  o->kl_in_reward = rl.kl().in_reward();
  RLMESH_ASSIGN_OR_RETURN(o->kl_estimator, ParseKlEstimator(rl.kl().estimator()));
  o->loss.kl_estimator = o->kl_estimator;
  o->loss.kl_coef = o->kl_in_reward ? 0.0 : o->kl_coef;
  RLMESH_ASSIGN_OR_RETURN(o->loss.agg, ParseLossAgg(rl.loss_agg()));
  // A constant normaliser, the same on every micro-batch and rank.
  o->loss.agg_normalizer = learner.max_new_tokens;
  const DynamicSamplingConfig& ds = rl.dynamic_sampling();
  o->drop_zero_variance = rl.drop_zero_variance() || !ds.mode().empty();
  o->refill_groups = ds.mode() == "refill" ? rl.prompts_per_step() : 0;
  o->overlong_filter = rl.overlong_filter();
  o->overlong_buffer = rl.overlong_buffer();
  o->overlong_penalty = rl.overlong_penalty();
  o->routing_replay = rl.routing_replay();
  if (rl.has_router_aux_loss_coef()) o->router_aux_loss_coef = rl.router_aux_loss_coef();
  const DistillationConfig& dc = rl.distillation();
  if (!dc.teacher().empty()) {
    o->distill.teacher = dc.teacher();
    o->distill.coef = dc.coef();
    o->distill.task_reward = dc.task_reward();
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view StageKindName(StageKind kind) {
  switch (kind) {
    case StageKind::kSft:
      return "sft";
    case StageKind::kRewardModel:
      return "reward_model";
    case StageKind::kDpo:
      return "dpo";
    case StageKind::kGrpo:
      return "grpo";
    case StageKind::kPpo:
      return "ppo";
  }
  return "unknown";
}

absl::Status PrefixStatus(const std::string& prefix, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, ".", status.message()));
}

OptimizerOptions MakeOptimizerOptions(const OptimizerConfig& c, int64_t total_steps) {
  OptimizerOptions o;
  o.adamw.beta1 = c.beta1();
  o.adamw.beta2 = c.beta2();
  o.adamw.eps = c.eps();
  o.adamw.weight_decay = c.weight_decay();
  o.schedule.peak_lr = c.lr();
  o.schedule.warmup_steps = c.warmup_steps();
  o.schedule.total_steps = std::max<int64_t>(1, total_steps);
  o.schedule.decay = c.schedule() == "cosine" ? LrDecay::kCosine : LrDecay::kConstant;
  o.schedule.min_lr_ratio = c.min_lr_ratio();
  o.grad_clip = c.grad_clip();
  return o;
}

absl::Status NormalizeForLearner(ExperimentConfig* exp, int world_size) {
  exp->mutable_learner()->set_shards(world_size);
  return PrefixStatus("experiment", NormalizeExperiment(exp, YamlSource{}));
}

absl::StatusOr<StageOptions> MakeStageOptions(const ExperimentConfig& exp, int stage_index, int shards) {
  StageOptions o;
  o.learner = MakeLearnerSettings(exp);
  // The replicas split the data; a replica's tensor-parallel ranks,
  // pipeline stages and context-parallel ranks share it.
  const int world_size = shards / o.learner.RanksPerReplica();
  const Stage& stage = exp.stages(stage_index);
  o.field = absl::StrCat("experiment.stages[", stage_index, "]");
  const std::string& sp = o.field;
  switch (stage.kind_case()) {
    case Stage::kSft: {
      const SftStage& sft = stage.sft();
      o.kind = StageKind::kSft;
      RLMESH_RETURN_IF_ERROR(ReadSupervisedStage(sp + ".sft", sft, world_size, &o.sft));
      o.sft.packing = sft.packing();
      o.sft.train_on_prompt = sft.train_on_prompt();
      break;
    }
    case Stage::kGrpo: {
      o.kind = StageKind::kGrpo;
      RLMESH_ASSIGN_OR_RETURN(o.rl.advantage, ParseAdvantage(stage.grpo().advantage()));
      RLMESH_RETURN_IF_ERROR(ReadRlConfig(stage.grpo().rl(), o.learner, &o.rl));
      break;
    }
    case Stage::kPpo: {
      const PpoStage& ppo = stage.ppo();
      o.kind = StageKind::kPpo;
      o.rl.advantage = Advantage::kPpo;
      RLMESH_RETURN_IF_ERROR(ReadRlConfig(ppo.rl(), o.learner, &o.rl));
      o.rl.gae.gamma = ppo.gamma();
      o.rl.gae.lam = ppo.lam();
      o.rl.gae.whiten = !ppo.no_whiten();
      o.rl.value_clip = ppo.value_clip();
      o.rl.vf_coef = ppo.vf_coef();
      o.rl.critic_optimizer = MakeOptimizerOptions(
          ppo.has_critic_optimizer() ? ppo.critic_optimizer() : ppo.rl().optimizer(),
          o.rl.steps * o.rl.epochs * o.rl.mini_batches);
      break;
    }
    case Stage::kRewardModel: {
      const RewardModelStage& rm = stage.reward_model();
      o.kind = StageKind::kRewardModel;
      RLMESH_RETURN_IF_ERROR(ReadSupervisedStage(sp + ".reward_model", rm, world_size, &o.pairs));
      o.pairs.output = rm.output();
      o.pairs.pairs_path = rm.pairs_path();
      break;
    }
    case Stage::kDpo: {
      const DpoStage& dpo = stage.dpo();
      o.kind = StageKind::kDpo;
      RLMESH_RETURN_IF_ERROR(ReadSupervisedStage(sp + ".dpo", dpo, world_size, &o.pairs));
      o.pairs.beta = dpo.beta();
      o.pairs.pairs_path = dpo.pairs_path();
      break;
    }
    default:
      return absl::InvalidArgumentError(sp + ": no stage kind set (sft, grpo, ppo, ...)");
  }
  o.name = stage.name().empty() ? std::string(StageKindName(o.kind)) : stage.name();
  return o;
}

absl::Status ResolveMoeSettings(const actor::ModelConfig& policy, StageOptions* stage) {
  if (!stage->is_rl()) return absl::OkStatus();
  RlOptions& rl = stage->rl;
  const std::string field = absl::StrCat(stage->field, ".", StageKindName(stage->kind), ".rl");
  if (policy.NumMoeLayers() == 0) {
    const std::string why = absl::StrCat(": needs a policy with MoE layers; this one (", policy.arch, ") has none");
    if (rl.routing_replay) return absl::InvalidArgumentError(field + ".routing_replay" + why);
    if (rl.router_aux_loss_coef >= 0) return absl::InvalidArgumentError(field + ".router_aux_loss_coef" + why);
    rl.router_aux_loss_coef = 0;
    return absl::OkStatus();
  }
  if (rl.router_aux_loss_coef < 0) {
    rl.router_aux_loss_coef = policy.output_router_logits ? policy.router_aux_loss_coef : 0.0;
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::learner
