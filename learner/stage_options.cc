#include "learner/stage_options.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace rlmesh::learner {
namespace {

// Steps and the global batch of an SFT/RM/DPO stage at `field`.
absl::Status CheckStepsBatch(const std::string& field, int64_t steps, int64_t batch, int world_size) {
  if (steps <= 0) return absl::InvalidArgumentError(field + ".steps: must be > 0");
  if (batch < world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".batch: must be >= the learner's data-parallel replicas (", world_size, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LearnerSettings> MakeLearnerSettings(const ExperimentConfig& exp) {
  LearnerSettings l;
  if (exp.learner().zero() != 0 && exp.learner().zero() != 1 && exp.learner().zero() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("experiment.learner.zero: must be 0, 1 or 3 (", exp.learner().zero(),
                     exp.learner().zero() == 2 ? ": ZeRO-2 is not built; 1 shards the optimizer state, 3 everything)"
                                               : ")"));
  }
  l.zero1 = exp.learner().zero() == 1;
  l.zero3 = exp.learner().zero() == 3;
  l.tp = exp.learner().tp() == 0 ? 1 : exp.learner().tp();
  l.sequence_parallel = exp.learner().sequence_parallel();
  if (l.tp < 1) return absl::InvalidArgumentError("experiment.learner.tp: must be >= 1");
  l.ep = exp.learner().ep() == 0 ? 1 : exp.learner().ep();
  if (l.ep < 1) return absl::InvalidArgumentError("experiment.learner.ep: must be >= 1");
  if (l.ep > 1 && (l.tp > 1 || l.zero1 || l.zero3)) {
    return absl::UnimplementedError(absl::StrCat("experiment.learner.ep: ", l.ep,
                                                 " with learner.tp > 1 or learner.zero: 1/3 is not built"));
  }
  if (l.sequence_parallel && l.tp == 1) {
    return absl::InvalidArgumentError("experiment.learner.sequence_parallel: needs learner.tp > 1");
  }
  if (l.sequence_parallel && l.zero3) {
    return absl::UnimplementedError(
        "experiment.learner.sequence_parallel: with learner.zero: 3 is not built (ZeRO-3 over tensor-parallel "
        "slices keeps the stream replicated)");
  }
  if (exp.learner().micro_batch_tokens() < 0) {
    return absl::InvalidArgumentError("experiment.learner.micro_batch_tokens: must be >= 0");
  }
  l.micro_tokens = exp.learner().micro_batch_tokens() == 0 ? 8192 : exp.learner().micro_batch_tokens();
  if (!exp.learner().autocast().empty() && exp.learner().autocast() != "fp32" &&
      exp.learner().autocast() != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("experiment.learner.autocast: \"", exp.learner().autocast(),
                                                   "\" is not fp32 or bf16"));
  }
  l.autocast_bf16 = exp.learner().autocast() == "bf16";
  l.gradient_checkpointing = exp.learner().gradient_checkpointing();
  if (!exp.learner().sleep().empty() && exp.learner().sleep() != "off" && exp.learner().sleep() != "cache") {
    return absl::InvalidArgumentError(
        absl::StrCat("experiment.learner.sleep: \"", exp.learner().sleep(), "\" is not off or cache"));
  }
  l.release_memory_after_step = exp.learner().sleep() == "cache";
  if (exp.checkpoint().keep() < 0) {
    return absl::InvalidArgumentError("experiment.checkpoint.keep: must be >= 0");
  }
  l.checkpoint_keep = exp.checkpoint().keep() == 0 ? 3 : exp.checkpoint().keep();
  const SamplingParams& sampling = exp.rollout().sampling();
  if (sampling.temperature() < 0) {
    return absl::InvalidArgumentError("experiment.rollout.sampling.temperature: must be >= 0");
  }
  l.temperature = (sampling.greedy() || sampling.temperature() == 0) ? 1.0 : sampling.temperature();
  l.max_new_tokens = sampling.max_new_tokens();
  return l;
}

absl::StatusOr<SftOptions> MakeSftOptions(const SftStage& sft, const std::string& field, int world_size) {
  SftOptions o;
  RLMESH_RETURN_IF_ERROR(CheckStepsBatch(field, sft.steps(), sft.batch(), world_size));
  o.steps = sft.steps();
  o.batch = sft.batch();
  o.packing = sft.packing();
  o.train_on_prompt = sft.train_on_prompt();
  RLMESH_ASSIGN_OR_RETURN(o.optimizer, MakeOptimizerOptions(sft.optimizer(), field + ".optimizer", sft.steps()));
  return o;
}

absl::StatusOr<PairOptions> MakeRewardModelOptions(const RewardModelStage& rm, const std::string& field,
                                                   int world_size) {
  PairOptions o;
  RLMESH_RETURN_IF_ERROR(CheckStepsBatch(field, rm.steps(), rm.batch(), world_size));
  o.batch = rm.batch();
  o.steps = rm.steps();
  o.output = rm.output();
  o.pairs_path = rm.pairs_path();
  RLMESH_ASSIGN_OR_RETURN(o.optimizer, MakeOptimizerOptions(rm.optimizer(), field + ".optimizer", rm.steps()));
  return o;
}

absl::StatusOr<PairOptions> MakeDpoOptions(const DpoStage& dpo, const std::string& field, int world_size) {
  PairOptions o;
  RLMESH_RETURN_IF_ERROR(CheckStepsBatch(field, dpo.steps(), dpo.batch(), world_size));
  if (dpo.beta() < 0 || !std::isfinite(dpo.beta())) {
    return absl::InvalidArgumentError(field + ".beta: must be > 0 (0 = the default 0.1)");
  }
  o.beta = dpo.beta() == 0 ? 0.1 : dpo.beta();
  o.batch = dpo.batch();
  o.steps = dpo.steps();
  o.pairs_path = dpo.pairs_path();
  RLMESH_ASSIGN_OR_RETURN(o.optimizer, MakeOptimizerOptions(dpo.optimizer(), field + ".optimizer", dpo.steps()));
  return o;
}

absl::StatusOr<Advantage> ParseAdvantage(const std::string& name, const std::string& field) {
  if (name.empty() || name == "grpo") return Advantage::kGrpo;
  if (name == "dr_grpo") return Advantage::kDrGrpo;
  if (name == "rloo") return Advantage::kRloo;
  if (name == "reinforce_pp") return Advantage::kReinforcePp;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": \"", name, "\" is not grpo, dr_grpo, rloo or reinforce_pp"));
}

// rl.mismatch (and rl.importance_cap, the tis cap) -> o->mismatch.
absl::Status ReadMismatch(const RlStage& rl, const std::string& field, RlOptions* o) {
  const MismatchConfig& mc = rl.mismatch();
  MismatchOptions& m = o->mismatch;
  if (!mc.mode().empty()) {
    auto mode = ParseMismatchMode(mc.mode());
    if (!mode.ok()) return PrefixStatus(field, mode.status());
    m.mode = *mode;
  }
  if (!mc.level().empty()) {
    auto level = ParseMismatchLevel(mc.level());
    if (!level.ok()) return PrefixStatus(field, level.status());
    m.level = *level;
  }
  if (rl.importance_cap() != 0 && m.mode != MismatchMode::kTis) {
    return absl::InvalidArgumentError(field + ".importance_cap: only used with mismatch.mode tis");
  }
  if (rl.importance_cap() != 0 && mc.high() != 0) {
    return absl::InvalidArgumentError(
        field + ".mismatch.high: importance_cap is the tis cap already; set one of them");
  }
  if (mc.low() < 0 || mc.high() < 0) {
    return absl::InvalidArgumentError(field + ".mismatch: low and high must be >= 0 (0 = the default)");
  }
  switch (m.mode) {
    case MismatchMode::kNone:
      m.high = 0;
      break;
    case MismatchMode::kTis:
      m.high = mc.high() != 0 ? mc.high() : o->loss.importance_cap;
      break;
    case MismatchMode::kMis:
      m.high = mc.high() != 0 ? mc.high() : 2.0;
      break;
    case MismatchMode::kIcePop:
      m.low = mc.low() != 0 ? mc.low() : 0.5;
      m.high = mc.high() != 0 ? mc.high() : 5.0;
      break;
  }
  if (m.mode != MismatchMode::kIcePop && mc.low() != 0) {
    return absl::InvalidArgumentError(field + ".mismatch.low: only mode icepop has a lower bound");
  }
  if (m.mode == MismatchMode::kNone && mc.high() != 0) {
    return absl::InvalidArgumentError(field + ".mismatch.high: not used with mode none");
  }
  // The loss's own cap stays in step with the tis cap (PolicyLoss uses it
  // only when called with behaviour log-probs and no precomputed weight).
  if (m.mode == MismatchMode::kTis) o->loss.importance_cap = m.high;
  return PrefixStatus(field, m.Validate());
}

// The fields every RL stage shares (`rl` at `field`, "...grpo.rl").
absl::Status ReadRlConfig(const RlStage& rl, const std::string& field, const LearnerSettings& learner,
                          RlOptions* o) {
  if (rl.steps() <= 0) return absl::InvalidArgumentError(field + ".steps: must be > 0");
  if (rl.epochs() < 0) return absl::InvalidArgumentError(field + ".epochs: must be >= 0");
  if (rl.mini_batches() < 0) return absl::InvalidArgumentError(field + ".mini_batches: must be >= 0");
  o->steps = rl.steps();
  o->epochs = rl.epochs() == 0 ? 1 : rl.epochs();
  o->mini_batches = rl.mini_batches() == 0 ? 1 : rl.mini_batches();
  const int64_t opt_steps = static_cast<int64_t>(rl.steps()) * o->epochs * o->mini_batches;
  RLMESH_ASSIGN_OR_RETURN(o->optimizer, MakeOptimizerOptions(rl.optimizer(), field + ".optimizer", opt_steps));
  if (rl.clip_low() < 0) return absl::InvalidArgumentError(field + ".clip_low: must be >= 0");
  if (rl.clip_high() < 0) return absl::InvalidArgumentError(field + ".clip_high: must be >= 0");
  o->loss.clip_low = rl.clip_low() == 0 ? 0.2 : rl.clip_low();
  o->loss.clip_high = rl.clip_high() == 0 ? o->loss.clip_low : rl.clip_high();
  o->loss.dual_clip = rl.dual_clip();
  // Zero means the default (2); a negative cap disables truncation.
  o->loss.importance_cap = rl.importance_cap() == 0 ? 2.0 : std::max(0.0, rl.importance_cap());
  RLMESH_RETURN_IF_ERROR(ReadMismatch(rl, field, o));
  std::string policy_loss = rl.policy_loss().empty() ? "ppo" : rl.policy_loss();
  auto kind = ParsePolicyLoss(policy_loss);
  if (!kind.ok()) return PrefixStatus(field, kind.status());
  o->loss.kind = *kind;
  o->loss.entropy_coef = rl.entropy_coef();
  if (rl.kl().coef() < 0) return absl::InvalidArgumentError(field + ".kl.coef: must be >= 0");
  o->kl_coef = rl.kl().coef();
  o->kl_in_reward = rl.kl().in_reward();
  if (!rl.kl().estimator().empty()) {
    auto est = ParseKlEstimator(rl.kl().estimator());
    if (!est.ok()) return PrefixStatus(field + ".kl.estimator", est.status());
    o->kl_estimator = *est;
  }
  o->loss.kl_estimator = o->kl_estimator;
  o->loss.kl_coef = o->kl_in_reward ? 0.0 : o->kl_coef;
  std::string agg = rl.loss_agg();
  // Dr.GRPO: no length normalisation unless the config says otherwise;
  // GSPO: the paper's mean over sequences of token means.
  if (agg.empty()) agg = o->advantage == Advantage::kDrGrpo ? "seq-mean-token-sum-norm" : "token-mean";
  if (rl.loss_agg().empty() && o->loss.kind == PolicyLossKind::kGspo) agg = "seq-mean-token-mean";
  auto parsed = ParseLossAgg(agg);
  if (!parsed.ok()) return PrefixStatus(field + ".loss_agg", parsed.status());
  o->loss.agg = *parsed;
  // A constant normaliser, the same on every micro-batch and rank.
  o->loss.agg_normalizer = learner.max_new_tokens > 0 ? learner.max_new_tokens : 0;
  RLMESH_RETURN_IF_ERROR(PrefixStatus(field, o->loss.Validate()));
  o->drop_zero_variance = rl.drop_zero_variance();
  const DynamicSamplingConfig& ds = rl.dynamic_sampling();
  if (!ds.mode().empty() && ds.mode() != "drop" && ds.mode() != "refill") {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dynamic_sampling.mode: \"", ds.mode(), "\" is not drop or refill"));
  }
  if (ds.max_rounds() != 0 && ds.mode() != "refill") {
    return absl::InvalidArgumentError(field + ".dynamic_sampling.max_rounds: only used with mode refill");
  }
  if (ds.max_rounds() < 0 || ds.max_rounds() > 64) {
    return absl::InvalidArgumentError(field + ".dynamic_sampling.max_rounds: must be in [0, 64] (0 = 4)");
  }
  if (ds.mode() == "refill" && rl.prompts_per_step() <= 0) {
    return absl::InvalidArgumentError(field + ".prompts_per_step: must be > 0 with dynamic_sampling.mode refill");
  }
  if (!ds.mode().empty()) o->drop_zero_variance = true;
  o->refill_groups = ds.mode() == "refill" ? rl.prompts_per_step() : 0;
  o->overlong_filter = rl.overlong_filter();
  if (rl.overlong_buffer() < 0) return absl::InvalidArgumentError(field + ".overlong_buffer: must be >= 0");
  if (rl.overlong_penalty() < 0) return absl::InvalidArgumentError(field + ".overlong_penalty: must be >= 0");
  o->overlong_buffer = rl.overlong_buffer();
  o->overlong_penalty = rl.overlong_penalty();
  o->routing_replay = rl.routing_replay();
  if (rl.has_router_aux_loss_coef()) {
    if (!(rl.router_aux_loss_coef() >= 0)) {
      return absl::InvalidArgumentError(field + ".router_aux_loss_coef: must be >= 0");
    }
    o->router_aux_loss_coef = rl.router_aux_loss_coef();
  }
  const DistillationConfig& dc = rl.distillation();
  const std::string df = field + ".distillation";
  if (dc.teacher().empty() && (dc.coef() != 0 || dc.task_reward())) {
    return absl::InvalidArgumentError(df + ".teacher: required when distillation.coef or task_reward is set");
  }
  if (!dc.teacher().empty()) {
    if (!(dc.coef() >= 0) || !std::isfinite(dc.coef())) {
      return absl::InvalidArgumentError(df + ".coef: must be > 0 (0 = the default 1)");
    }
    o->distill.teacher = dc.teacher();
    o->distill.coef = dc.coef() == 0 ? 1.0 : dc.coef();
    o->distill.task_reward = dc.task_reward();
    if (!o->distill.task_reward && o->drop_zero_variance) {
      // Zero-variance groups carry the teacher's signal like any other.
      return absl::InvalidArgumentError(
          field + ".dynamic_sampling: dropping groups by reward variance needs distillation.task_reward "
                  "(pure distillation does not train on the rewards)");
    }
    if (!o->distill.task_reward && o->overlong_buffer > 0) {
      return absl::InvalidArgumentError(field + ".overlong_buffer: shapes the reward, which pure distillation "
                                                "does not train on (set distillation.task_reward)");
    }
    if (!o->distill.task_reward && o->kl_coef > 0 && o->kl_in_reward) {
      return absl::InvalidArgumentError(field + ".kl.in_reward: pure distillation does not train on the reward "
                                                "(set distillation.task_reward, or keep the KL in the loss)");
    }
  }
  if (o->overlong_buffer > 0 && (learner.max_new_tokens <= 0 || o->overlong_buffer > learner.max_new_tokens)) {
    return absl::InvalidArgumentError(
        field + ".overlong_buffer: needs 0 < overlong_buffer <= experiment.rollout.sampling.max_new_tokens");
  }
  return absl::OkStatus();
}

absl::StatusOr<RlOptions> MakeGrpoOptions(const GrpoStage& grpo, const std::string& field,
                                          const LearnerSettings& learner) {
  RlOptions o;
  RLMESH_ASSIGN_OR_RETURN(o.advantage, ParseAdvantage(grpo.advantage(), field + ".advantage"));
  RLMESH_RETURN_IF_ERROR(ReadRlConfig(grpo.rl(), field + ".rl", learner, &o));
  return o;
}

absl::StatusOr<RlOptions> MakePpoOptions(const PpoStage& ppo, const std::string& field,
                                         const LearnerSettings& learner) {
  RlOptions o;
  o.advantage = Advantage::kPpo;
  o.gae.gamma = ppo.gamma() == 0 ? 1.0 : ppo.gamma();
  o.gae.lam = ppo.lam() == 0 ? 0.95 : ppo.lam();
  o.gae.whiten = !ppo.no_whiten();
  RLMESH_RETURN_IF_ERROR(PrefixStatus(field, o.gae.Validate()));
  if (ppo.value_clip() < 0) return absl::InvalidArgumentError(field + ".value_clip: must be >= 0");
  o.value_clip = ppo.value_clip() == 0 ? 0.2 : ppo.value_clip();
  if (ppo.vf_coef() < 0) return absl::InvalidArgumentError(field + ".vf_coef: must be >= 0");
  o.vf_coef = ppo.vf_coef() == 0 ? 0.5 : ppo.vf_coef();
  RLMESH_RETURN_IF_ERROR(ReadRlConfig(ppo.rl(), field + ".rl", learner, &o));
  if (o.distill.on()) {
    return absl::UnimplementedError(field + ".rl.distillation: only GRPO-family stages distil (PPO's critic "
                                            "would need the teacher's per-token rewards in its returns; not built)");
  }
  const OptimizerConfig& co = ppo.critic_optimizer().lr() > 0 ? ppo.critic_optimizer() : ppo.rl().optimizer();
  const int64_t opt_steps = o.steps * o.epochs * o.mini_batches;
  RLMESH_ASSIGN_OR_RETURN(o.critic_optimizer,
                          MakeOptimizerOptions(co, field + ".critic_optimizer", opt_steps));
  return o;
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

absl::StatusOr<OptimizerOptions> MakeOptimizerOptions(const OptimizerConfig& c, const std::string& field,
                                                      int64_t total_steps) {
  OptimizerOptions o;
  if (!(c.lr() > 0)) return absl::InvalidArgumentError(field + ".lr: must be > 0");
  o.adamw.beta1 = c.beta1() == 0 ? 0.9 : c.beta1();
  o.adamw.beta2 = c.beta2() == 0 ? 0.999 : c.beta2();
  o.adamw.eps = c.eps() == 0 ? 1e-8 : c.eps();
  o.adamw.weight_decay = c.weight_decay();
  RLMESH_RETURN_IF_ERROR(PrefixStatus(field, o.adamw.Validate()));
  o.schedule.peak_lr = c.lr();
  o.schedule.warmup_steps = c.warmup_steps();
  o.schedule.total_steps = std::max<int64_t>(1, total_steps);
  if (c.schedule().empty() || c.schedule() == "constant") {
    o.schedule.decay = LrDecay::kConstant;
  } else if (c.schedule() == "cosine") {
    o.schedule.decay = LrDecay::kCosine;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".schedule: \"", c.schedule(), "\" is not constant or cosine"));
  }
  o.schedule.min_lr_ratio = c.min_lr_ratio();
  RLMESH_RETURN_IF_ERROR(PrefixStatus(field, o.schedule.Validate()));
  if (c.warmup_steps() < 0) return absl::InvalidArgumentError(field + ".warmup_steps: must be >= 0");
  o.grad_clip = c.grad_clip() == 0 ? 1.0 : c.grad_clip();
  return o;
}

absl::StatusOr<StageOptions> MakeStageOptions(const ExperimentConfig& exp, int stage_index, int shards) {
  StageOptions o;
  RLMESH_ASSIGN_OR_RETURN(o.learner, MakeLearnerSettings(exp));
  if (shards % o.learner.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("experiment.learner.tp: ", o.learner.tp,
                                                   " does not divide the learner world size (", shards, ")"));
  }
  if (shards % o.learner.ep != 0) {
    return absl::InvalidArgumentError(absl::StrCat("experiment.learner.ep: ", o.learner.ep,
                                                   " does not divide the learner world size (", shards, ")"));
  }
  // The replicas split the data; a replica's tensor-parallel ranks share it.
  const int world_size = shards / o.learner.tp;
  const Stage& stage = exp.stages(stage_index);
  o.field = absl::StrCat("experiment.stages[", stage_index, "]");
  const std::string& sp = o.field;
  switch (stage.kind_case()) {
    case Stage::kSft: {
      o.kind = StageKind::kSft;
      RLMESH_ASSIGN_OR_RETURN(o.sft, MakeSftOptions(stage.sft(), sp + ".sft", world_size));
      break;
    }
    case Stage::kGrpo: {
      o.kind = StageKind::kGrpo;
      RLMESH_ASSIGN_OR_RETURN(o.rl, MakeGrpoOptions(stage.grpo(), sp + ".grpo", o.learner));
      break;
    }
    case Stage::kPpo: {
      o.kind = StageKind::kPpo;
      RLMESH_ASSIGN_OR_RETURN(o.rl, MakePpoOptions(stage.ppo(), sp + ".ppo", o.learner));
      break;
    }
    case Stage::kRewardModel: {
      o.kind = StageKind::kRewardModel;
      RLMESH_ASSIGN_OR_RETURN(o.pairs,
                              MakeRewardModelOptions(stage.reward_model(), sp + ".reward_model", world_size));
      break;
    }
    case Stage::kDpo: {
      o.kind = StageKind::kDpo;
      RLMESH_ASSIGN_OR_RETURN(o.pairs, MakeDpoOptions(stage.dpo(), sp + ".dpo", world_size));
      break;
    }
    default:
      return absl::InvalidArgumentError(sp + ": no stage kind set (sft, grpo, ppo, ...)");
  }
  o.name = stage.name().empty() ? std::string(StageKindName(o.kind)) : stage.name();
  if (o.learner.ep > 1) {
    // learner/expert_parallel.h steps the policy only. DPO's frozen
    // reference and PPO's critic stay whole on every rank (the critic
    // data-parallel over all the ranks).
    if (o.kind == StageKind::kRewardModel) {
      return absl::UnimplementedError(absl::StrCat(
          "experiment.learner.ep: ", o.learner.ep, " is built for sft, dpo, grpo and ppo stages; ", sp,
          " is reward_model (a policy with a value head does not run through the expert-parallel model yet)"));
    }
    if (o.learner.autocast_bf16) {
      return absl::UnimplementedError("experiment.learner.ep > 1 with learner.autocast: bf16 is not built");
    }
  }
  if (o.learner.tp > 1) {
    // learner/tensor_parallel.h carries log-probs (the policy's, and the
    // frozen reference's, split like the policy, for KL and DPO) and
    // values (a reward model's, PPO's critic's, also split like the
    // policy).
    if (o.learner.autocast_bf16) {
      return absl::UnimplementedError("experiment.learner.tp > 1 with learner.autocast: bf16 is not built");
    }
  }
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
