#include "schema/experiment.h"

#include <cctype>
#include <cmath>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/device_spec.h"

namespace rlmesh {
namespace {

class Checker {
 public:
  explicit Checker(const YamlSource& source) : source_(source) {}
  absl::Status status() const { return status_; }
  void Require(bool ok, const std::string& path, const std::string& message) {
    if (!ok && status_.ok()) status_ = source_.Error(path, message);
  }

 private:
  const YamlSource& source_;
  absl::Status status_;
};

// Defaults an optimizer's zero fields (proto/config.proto) and checks it.
void CheckOptimizer(Checker& c, OptimizerConfig* o, const std::string& path) {
  if (o->beta1() == 0) o->set_beta1(0.9);
  if (o->beta2() == 0) o->set_beta2(0.999);
  if (o->eps() == 0) o->set_eps(1e-8);
  if (o->grad_clip() == 0) o->set_grad_clip(1.0);
  if (o->schedule().empty()) o->set_schedule("constant");
  c.Require(o->lr() > 0 && o->lr() < 1, path + ".lr", "must be in (0, 1)");
  c.Require(o->weight_decay() >= 0 && std::isfinite(o->weight_decay()), path + ".weight_decay", "must be >= 0");
  c.Require(o->beta1() > 0 && o->beta1() < 1, path + ".beta1", "must be in (0, 1) (0 = the default 0.9)");
  c.Require(o->beta2() > 0 && o->beta2() < 1, path + ".beta2", "must be in (0, 1) (0 = the default 0.999)");
  c.Require(o->eps() > 0 && o->eps() < 1, path + ".eps", "must be in (0, 1) (0 = the default 1e-8)");
  c.Require(o->warmup_steps() >= 0, path + ".warmup_steps", "must be >= 0");
  c.Require(o->schedule() == "constant" || o->schedule() == "cosine", path + ".schedule",
            "must be constant or cosine");
  c.Require(o->min_lr_ratio() >= 0 && o->min_lr_ratio() <= 1, path + ".min_lr_ratio", "must be in [0, 1]");
  c.Require(o->grad_clip() == -1 || (o->grad_clip() > 0 && std::isfinite(o->grad_clip())), path + ".grad_clip",
            "must be > 0, or -1 for no clipping (0 = the default 1.0)");
}

// Checks the mismatch correction (rl.mismatch, rl.importance_cap), then
// writes each unset value the mode defaults to. tis's cap ends up in
// mismatch.high (importance_cap is its other name, cleared).
void CheckMismatch(Checker& c, RlStage* rl, const std::string& path) {
  MismatchConfig* mm = rl->mutable_mismatch();
  c.Require(mm->mode().empty() || mm->mode() == "none" || mm->mode() == "tis" || mm->mode() == "mis" ||
                mm->mode() == "icepop",
            path + ".mismatch.mode", "must be none, tis, mis or icepop");
  c.Require(mm->level().empty() || mm->level() == "token" || mm->level() == "sequence", path + ".mismatch.level",
            "must be token or sequence");
  const bool tis = mm->mode().empty() || mm->mode() == "tis";
  c.Require(rl->importance_cap() >= 0 && std::isfinite(rl->importance_cap()), path + ".importance_cap",
            "must be >= 0");
  c.Require(rl->importance_cap() == 0 || tis, path + ".importance_cap", "only used with mismatch.mode tis");
  c.Require(rl->importance_cap() == 0 || mm->high() == 0, path + ".mismatch.high",
            "importance_cap is the tis cap already; set one of them");
  c.Require(mm->low() == 0 || mm->mode() == "icepop", path + ".mismatch.low", "only mode icepop has a lower bound");
  c.Require(mm->low() >= 0 && mm->low() <= 1, path + ".mismatch.low", "must be in [0, 1] (0 = the default 0.5)");
  c.Require(mm->high() == 0 || mm->mode() != "none", path + ".mismatch.high", "not used with mode none");
  c.Require(mm->high() == 0 || tis || mm->high() >= 1, path + ".mismatch.high", "must be >= 1 (0 = the default)");
  c.Require(mm->high() >= 0 && std::isfinite(mm->high()), path + ".mismatch.high",
            "must be >= 0 (0 = the default)");
  if (mm->mode().empty()) mm->set_mode("tis");
  if (mm->level().empty()) mm->set_level("token");
  if (mm->mode() == "tis" && mm->high() == 0) {
    mm->set_high(rl->importance_cap() != 0 ? rl->importance_cap() : 2.0);
    rl->set_importance_cap(0);
  }
  if (mm->mode() == "mis" && mm->high() == 0) mm->set_high(2.0);
  if (mm->mode() == "icepop") {
    if (mm->low() == 0) mm->set_low(0.5);
    if (mm->high() == 0) mm->set_high(5.0);
  }
}

// `default_loss_agg`: the advantage estimator's (Dr.GRPO does not normalise
// by length). `max_new_tokens`: rollout.sampling's, after its default.
void CheckRl(Checker& c, RlStage* rl, const std::string& path, bool group_method,
             const std::string& default_loss_agg, int max_new_tokens) {
  DistillationConfig* dc = rl->mutable_distillation();
  const bool distill = !dc->teacher().empty();
  c.Require(distill || (dc->coef() == 0 && !dc->task_reward()), path + ".distillation.teacher",
            "required when distillation.coef or task_reward is set");
  c.Require(dc->coef() >= 0 && std::isfinite(dc->coef()), path + ".distillation.coef",
            "must be > 0 (0 = the default 1)");
  if (distill && dc->coef() == 0) dc->set_coef(1.0);
  c.Require(rl->steps() > 0, path + ".steps", "must be > 0");
  c.Require(rl->prompts_per_step() > 0, path + ".prompts_per_step", "must be > 0");
  if (rl->samples_per_prompt() == 0) rl->set_samples_per_prompt(group_method ? 8 : 1);
  c.Require(rl->samples_per_prompt() > 0 && rl->samples_per_prompt() <= 256, path + ".samples_per_prompt",
            "must be in [1, 256]");
  // Pure distillation trains on the teacher's per-token term only: one
  // sample per prompt is enough (the default stays the stage's).
  if (group_method && !(distill && !dc->task_reward())) {
    c.Require(rl->samples_per_prompt() >= 2, path + ".samples_per_prompt",
              "must be >= 2 for group-relative advantages");
  }
  CheckOptimizer(c, rl->mutable_optimizer(), path + ".optimizer");
  if (rl->clip_low() == 0) rl->set_clip_low(0.2);
  if (rl->clip_high() == 0) rl->set_clip_high(rl->clip_low());
  c.Require(rl->clip_low() > 0 && rl->clip_low() < 1, path + ".clip_low", "must be in (0, 1)");
  c.Require(rl->clip_high() > 0 && rl->clip_high() < 10, path + ".clip_high", "must be in (0, 10)");
  c.Require(rl->dual_clip() == 0 || (rl->dual_clip() > 1 && std::isfinite(rl->dual_clip())), path + ".dual_clip",
            "must be 0 (off) or > 1");
  c.Require(rl->kl().coef() >= 0 && std::isfinite(rl->kl().coef()), path + ".kl.coef", "must be >= 0");
  if (rl->kl().estimator().empty()) rl->mutable_kl()->set_estimator("k3");
  const std::string& est = rl->kl().estimator();
  c.Require(est == "k1" || est == "k2" || est == "k3", path + ".kl.estimator", "must be k1, k2 or k3");
  c.Require(rl->entropy_coef() >= 0 && std::isfinite(rl->entropy_coef()), path + ".entropy_coef", "must be >= 0");
  if (rl->policy_loss().empty()) rl->set_policy_loss("ppo");
  const std::string& pl = rl->policy_loss();
  c.Require(pl == "ppo" || pl == "gspo" || pl == "cispo", path + ".policy_loss", "must be ppo, gspo or cispo");
  c.Require(pl != "cispo" || rl->dual_clip() == 0, path + ".dual_clip", "not used by policy_loss cispo");
  // GSPO's paper averages token means over sequences.
  if (rl->loss_agg().empty()) rl->set_loss_agg(pl == "gspo" ? "seq-mean-token-mean" : default_loss_agg);
  const std::string& agg = rl->loss_agg();
  c.Require(agg == "token-mean" || agg == "seq-mean-token-mean" || agg == "seq-mean-token-sum" ||
                agg == "seq-mean-token-sum-norm",
            path + ".loss_agg",
            "must be token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm");
  c.Require(rl->max_staleness() >= 0 && rl->max_staleness() <= 16, path + ".max_staleness", "must be in [0, 16]");
  if (rl->epochs() == 0) rl->set_epochs(1);
  if (rl->mini_batches() == 0) rl->set_mini_batches(1);
  c.Require(rl->epochs() >= 1 && rl->epochs() <= 16, path + ".epochs", "must be in [1, 16] (0 = the default 1)");
  c.Require(rl->mini_batches() >= 1 && rl->mini_batches() <= 64, path + ".mini_batches",
            "must be in [1, 64] (0 = the default 1)");
  c.Require(rl->overlong_buffer() >= 0 && rl->overlong_buffer() <= max_new_tokens, path + ".overlong_buffer",
            "must be in [0, rollout.sampling.max_new_tokens]");
  c.Require(rl->overlong_penalty() >= 0 && std::isfinite(rl->overlong_penalty()), path + ".overlong_penalty",
            "must be >= 0");
  c.Require(!rl->has_router_aux_loss_coef() ||
                (rl->router_aux_loss_coef() >= 0 && std::isfinite(rl->router_aux_loss_coef())),
            path + ".router_aux_loss_coef", "must be >= 0");
  CheckMismatch(c, rl, path);
  const DynamicSamplingConfig& ds = rl->dynamic_sampling();
  c.Require(ds.mode().empty() || ds.mode() == "drop" || ds.mode() == "refill", path + ".dynamic_sampling.mode",
            "must be drop or refill");
  c.Require(ds.max_rounds() == 0 || ds.mode() == "refill", path + ".dynamic_sampling.max_rounds",
            "only used with mode refill");
  c.Require(ds.mode() != "refill" || rl->samples_per_prompt() >= 2, path + ".dynamic_sampling.mode",
            "refill needs samples_per_prompt >= 2 (a group of one never varies)");
  c.Require(ds.max_rounds() >= 0 && ds.max_rounds() <= 64, path + ".dynamic_sampling.max_rounds",
            "must be in [0, 64] (0 = 4)");
  // Pure distillation trains on the teacher's term alone: settings that
  // act on the task reward would be silently ignored.
  const bool pure = distill && !dc->task_reward();
  c.Require(!pure || (ds.mode().empty() && !rl->drop_zero_variance()), path + ".dynamic_sampling",
            "dropping groups by reward variance needs distillation.task_reward");
  c.Require(!pure || rl->overlong_buffer() == 0, path + ".overlong_buffer",
            "shapes the reward, which pure distillation does not train on (set distillation.task_reward)");
  c.Require(!pure || !rl->kl().in_reward() || rl->kl().coef() == 0, path + ".kl.in_reward",
            "pure distillation does not train on the reward (set distillation.task_reward)");
}

// The dataset kinds' fields (the task itself checks its files when loaded).
void CheckTask(Checker& c, const ExperimentConfig& config) {
  const TaskConfig& t = config.task();
  const std::string kind = t.kind().empty() ? "arithmetic" : t.kind();
  c.Require(kind == "arithmetic" || kind == "countdown" || kind == "jsonl" || kind == "chat" || kind == "text",
            "task.kind", "must be arithmetic, countdown, jsonl, chat or text");
  c.Require(t.messages_field().empty() || kind == "chat", "task.messages_field", "only for kind chat");
  c.Require(t.text_field().empty() || kind == "text", "task.text_field", "only for kind text");
  c.Require(t.sequence_length() == 0 || kind == "text", "task.sequence_length", "only for kind text");
  if (kind == "chat") {
    c.Require(!t.train_path().empty(), "task.train_path", "required for kind chat");
    c.Require(!t.chat_template().empty(), "task.chat_template",
              "required for kind chat (\"model\" or a Jinja file)");
    c.Require(t.prompt_template().empty(), "task.prompt_template",
              "not used by kind chat (the chat template renders the turns)");
    c.Require(t.prompt_field().empty(), "task.prompt_field", "not used by kind chat (see messages_field)");
  }
  if (kind != "text") return;
  c.Require(!t.train_path().empty(), "task.train_path", "required for kind text");
  c.Require(t.eval_path().empty(), "task.eval_path", "not used by kind text (a corpus has no held-out prompts)");
  c.Require(t.chat_template().empty(), "task.chat_template", "not used by kind text (documents are trained on as they are)");
  c.Require(t.system_prompt().empty(), "task.system_prompt", "not used by kind text");
  c.Require(t.prompt_template().empty(), "task.prompt_template", "not used by kind text");
  c.Require(t.prompt_field().empty(), "task.prompt_field", "not used by kind text (see text_field)");
  c.Require(t.answer_field().empty(), "task.answer_field", "not used by kind text");
  c.Require(t.sequence_length() >= 0 && t.sequence_length() <= config.model().max_positions(), "task.sequence_length",
            "must be in [0, model.max_positions] (0 = model.max_positions)");
  for (int i = 0; i < config.stages_size(); ++i) {
    const Stage& st = config.stages(i);
    const std::string p = absl::StrCat("stages[", i, "]");
    c.Require(st.has_sft(), p, "task kind text trains SFT stages only (a corpus has no prompts or pairs)");
    c.Require(!st.has_sft() || st.sft().until().eval_accuracy() == 0, p + ".sft.until.eval_accuracy",
              "must be 0 with task kind text (no held-out prompts)");
  }
}

// Where `coordinator run`'s workers generate: rollout.device, else
// model.device.
std::string RolloutDevice(const ExperimentConfig& config) {
  return !config.rollout().device().empty() ? config.rollout().device() : config.model().device();
}

// The experiment's name and that it has stages.
void CheckName(Checker& c, ExperimentConfig* config) {
  c.Require(!config->name().empty(), "name", "required");
  for (char ch : config->name()) {
    c.Require(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.', "name",
              "only letters, digits, '_', '-' and '.'");
  }
  c.Require(config->stages_size() > 0, "stages", "at least one stage is required");
}

// model: the architecture of a scratch model, or the folder to start from.
void CheckModel(Checker& c, ExperimentConfig* config) {
  ModelConfig* m = config->mutable_model();
  if (m->init().empty()) m->set_init("scratch");
  c.Require(m->init() == "scratch" || m->init() == "checkpoint", "model.init", "must be scratch or checkpoint");
  c.Require(m->init() != "checkpoint" || !m->path().empty(), "model.path", "required when init is checkpoint");
  if (m->arch().empty()) m->set_arch("llama");
  c.Require(m->arch() == "llama" || m->arch() == "qwen2" || m->arch() == "qwen3", "model.arch",
            "must be llama, qwen2 or qwen3");
  if (m->hidden() == 0) m->set_hidden(256);
  if (m->layers() == 0) m->set_layers(4);
  if (m->heads() == 0) m->set_heads(4);
  if (m->kv_heads() == 0) m->set_kv_heads(m->heads());
  if (m->max_positions() == 0) m->set_max_positions(256);
  c.Require(m->hidden() > 0 && m->hidden() <= 16384, "model.hidden", "must be in [1, 16384]");
  c.Require(m->layers() > 0 && m->layers() <= 256, "model.layers", "must be in [1, 256]");
  c.Require(m->heads() > 0 && (m->head_dim() > 0 || m->hidden() % m->heads() == 0), "model.heads",
            "must divide model.hidden (or set model.head_dim)");
  c.Require(m->head_dim() >= 0 && m->head_dim() % 2 == 0 && m->head_dim() <= 1024, "model.head_dim",
            "must be even, in [0, 1024]");
  c.Require(m->kv_heads() > 0 && m->heads() % m->kv_heads() == 0, "model.kv_heads", "must divide model.heads");
  c.Require(m->max_positions() > 1, "model.max_positions", "must be > 1");
  if (m->tokenizer().empty()) m->set_tokenizer("char");
  c.Require(m->dtype().empty() || m->dtype() == "fp32", "model.dtype",
            "must be fp32: the learners train fp32 master weights (set rollout.dtype for bf16 or fp16 generation)");
  {
    // The learner resolves the device when it loads the model (dist/device.h):
    // here only the text, with the same rule.
    absl::StatusOr<int> device = ParseDeviceSpec(m->device(), "model.device");
    c.Require(device.ok(), "model.device", "must be cpu, cuda or cuda:<index> (index in [0, 63])");
  }
}

// rollout: workers, their device and dtype, and the training sampling.
void CheckRollout(Checker& c, ExperimentConfig* config) {
  RolloutConfig* r = config->mutable_rollout();
  const ModelConfig* m = &config->model();
  if (r->workers() == 0) r->set_workers(1);
  c.Require(r->workers() > 0 && r->workers() <= 64, "rollout.workers", "must be in [1, 64]");
  c.Require(ParseDeviceSpec(r->device(), "rollout.device").ok(), "rollout.device",
            "must be cpu, cuda or cuda:<index> (index in [0, 63])");
  SamplingParams* s = r->mutable_sampling();
  if (s->temperature() == 0) s->set_temperature(1.0f);
  if (s->max_new_tokens() == 0) s->set_max_new_tokens(16);
  if (s->top_p() == 0) s->set_top_p(1.0f);
  // Training rollouts sample, with streams keyed by the experiment seed,
  // the stage and the step: a seed or greedy here would not be used.
  c.Require(s->seed() == 0, "rollout.sampling.seed", "not used: every stream derives from the experiment's `seed`");
  c.Require(!s->greedy(), "rollout.sampling.greedy",
            "not used: training rollouts sample (held-out evaluation is greedy anyway)");
  c.Require(s->temperature() > 0, "rollout.sampling.temperature", "must be > 0");
  c.Require(s->top_p() > 0 && s->top_p() <= 1, "rollout.sampling.top_p", "must be in (0, 1]");
  c.Require(s->top_k() >= 0, "rollout.sampling.top_k", "must be >= 0");
  c.Require(s->max_new_tokens() > 0 && s->max_new_tokens() < m->max_positions(), "rollout.sampling.max_new_tokens",
            "must be in [1, model.max_positions)");
  c.Require(r->on_update().empty() || r->on_update() == "finish" || r->on_update() == "abort" ||
                r->on_update() == "partial",
            "rollout.on_update", "must be finish, abort or partial");
  c.Require(r->request_timeout_ms() >= 0, "rollout.request_timeout_ms", "must be >= 0 (0 = no straggler deadline)");
  const std::string rollout_device = RolloutDevice(*config);
  const bool rollout_on_cpu = rollout_device.empty() || rollout_device == "cpu";
  if (r->tp() == 0) r->set_tp(1);
  c.Require(r->tp() >= 1 && r->tp() <= 64, "rollout.tp", "must be in [1, 64]");
  c.Require(r->tp() == 1 || rollout_on_cpu, "rollout.tp",
            "> 1 generates on the CPU only (rollout.device / model.device is not cpu)");
  c.Require(r->dtype().empty() || r->dtype() == "fp32" || r->dtype() == "bf16" || r->dtype() == "fp16",
            "rollout.dtype", "must be fp32, bf16 or fp16");
  c.Require(r->tp() == 1 || r->dtype().empty() || r->dtype() == "fp32", "rollout.dtype",
            "must be fp32 with rollout.tp > 1 (the split model generates in fp32)");
  c.Require(r->on_timeout().empty() || r->on_timeout() == "redispatch" || r->on_timeout() == "drop",
            "rollout.on_timeout", "must be redispatch or drop");
  c.Require(r->on_timeout().empty() || r->request_timeout_ms() > 0, "rollout.on_timeout",
            "set without rollout.request_timeout_ms");
  c.Require(r->sleep().empty() || r->sleep() == "off" || RolloutSleeps(*r), "rollout.sleep",
            "must be off, cache or weights");
  c.Require(r->cuda_memory_fraction() >= 0 && r->cuda_memory_fraction() <= 1, "rollout.cuda_memory_fraction",
            "must be in (0, 1] (0 = no cap)");
  c.Require(r->cuda_memory_fraction() == 0 || !rollout_on_cpu, "rollout.cuda_memory_fraction",
            "set but the workers generate on the CPU (rollout.device / model.device)");
  c.Require(!r->cuda_graphs() || !rollout_on_cpu, "rollout.cuda_graphs",
            "set but the workers generate on the CPU (rollout.device / model.device)");
}

// environment: multi-turn rollouts (the rollout worker checks the same at Submit).
void CheckEnvironment(Checker& c, ExperimentConfig* config) {
  const RolloutConfig* r = &config->rollout();
  // Multi-turn rollouts (the rollout worker checks the same at Submit).
  const EnvironmentConfig& env = config->environment();
  c.Require(!env.launch() || env.address().empty(), "environment.address",
            "set together with environment.launch (launch starts a server and uses its address)");
  if (env.address().empty() && !env.launch()) {
    c.Require(env.name().empty(), "environment.name", "set without environment.address or launch");
    c.Require(env.max_turns() == 0, "environment.max_turns", "set without environment.address or launch");
    c.Require(env.max_total_tokens() == 0, "environment.max_total_tokens", "set without environment.address or launch");
    c.Require(env.stop_markers_size() == 0, "environment.stop_markers", "set without environment.address or launch");
    c.Require(env.timeout_ms() == 0, "environment.timeout_ms", "set without environment.address or launch");
    c.Require(!env.has_reward_weight(), "environment.reward_weight", "set without environment.address or launch");
  } else {
    c.Require(env.max_turns() >= 0 && env.max_turns() <= 64, "environment.max_turns", "must be in [1, 64] (0 = 4)");
    c.Require(env.max_total_tokens() >= 0, "environment.max_total_tokens", "must be >= 0");
    c.Require(env.stop_markers_size() > 0, "environment.stop_markers", "need at least one (e.g. \"</calc>\")");
    for (int i = 0; i < env.stop_markers_size(); ++i) {
      c.Require(!env.stop_markers(i).empty(), absl::StrCat("environment.stop_markers[", i, "]"), "must not be empty");
    }
    c.Require(env.timeout_ms() >= 0, "environment.timeout_ms", "must be >= 0 (0 = 10000)");
    c.Require(!env.has_reward_weight() || std::isfinite(env.reward_weight()), "environment.reward_weight",
              "must be finite");
    c.Require(r->on_update() != "abort", "environment",
              "multi-turn rollouts need rollout.on_update finish or partial (abort would replay the environment)");
  }
}

// reward: servers, verifiers and the call policy.
void CheckReward(Checker& c, ExperimentConfig* config) {
  RewardConfig* rw = config->mutable_reward();
  if (rw->servers() == 0) rw->set_servers(1);
  c.Require(rw->servers() > 0 && rw->servers() <= 64, "reward.servers", "must be in [1, 64]");
  if (rw->verifiers_size() == 0) rw->add_verifiers()->set_name("numeric_answer");
  if (rw->verifier_timeout_ms() == 0) rw->set_verifier_timeout_ms(1000);
  c.Require(rw->verifier_timeout_ms() > 0, "reward.verifier_timeout_ms", "must be > 0");
  RewardCallPolicy* call = rw->mutable_call();
  if (call->on_failure().empty()) call->set_on_failure("retry");
  if (!call->has_retries()) call->set_retries(2);
  if (!call->has_breaker_failures()) call->set_breaker_failures(5);
  if (call->breaker_cooldown_ms() == 0) call->set_breaker_cooldown_ms(10000);
  c.Require(call->timeout_ms() >= 0, "reward.call.timeout_ms", "must be >= 0 (0 = the worker's own)");
  c.Require(call->on_failure() == "retry" || call->on_failure() == "zero" || call->on_failure() == "drop_group",
            "reward.call.on_failure", "must be retry, zero or drop_group");
  c.Require(call->retries() >= 0 && call->retries() <= 100, "reward.call.retries", "must be in [0, 100]");
  c.Require(call->breaker_failures() >= 0 && call->breaker_failures() <= 1000, "reward.call.breaker_failures",
            "must be in [0, 1000] (0 = no circuit breaker)");
  c.Require(call->breaker_cooldown_ms() > 0, "reward.call.breaker_cooldown_ms", "must be > 0");
}

// learner.pp and its settings: what the pipeline is built for.
void CheckPipeline(Checker& c, ExperimentConfig* config) {
  LearnerConfig* l = config->mutable_learner();
  if (l->pp() == 0) l->set_pp(1);
  if (l->pp_schedule().empty()) l->set_pp_schedule("1f1b");
  const int pp = l->pp();
  c.Require(pp >= 1 && l->tp() >= 1 && pp * l->tp() <= l->shards() && l->shards() % (pp * l->tp()) == 0,
            "learner.pp",
            absl::StrCat("must divide learner.shards (", l->shards(), ")",
                         l->tp() > 1 ? absl::StrCat(" with learner.tp (", pp * l->tp(), " ranks per replica)") : ""));
  c.Require(l->pp_microbatches() >= 0 && l->pp_microbatches() <= 4096, "learner.pp_microbatches",
            "must be in [0, 4096] (0 = 2 x learner.pp)");
  if (pp > 1 && l->pp_microbatches() == 0) l->set_pp_microbatches(2 * pp);
  const bool interleaved = l->pp_schedule() == "interleaved";
  c.Require(l->pp_schedule() == "1f1b" || interleaved, "learner.pp_schedule", "must be 1f1b or interleaved");
  c.Require(!interleaved || pp > 1, "learner.pp_schedule", "interleaved needs learner.pp > 1");
  if (l->pp_virtual_stages() == 0) l->set_pp_virtual_stages(interleaved ? 2 : 1);
  const int v = l->pp_virtual_stages();
  c.Require(interleaved ? v >= 2 && v <= 64 : v == 1, "learner.pp_virtual_stages",
            interleaved ? "must be in [2, 64] under pp_schedule interleaved"
                        : "must be 1 (or 0) under pp_schedule 1f1b; > 1 is the interleaved schedule's");
  c.Require(l->pp_layers_size() == 0 || l->pp_layers_size() == pp * v, "learner.pp_layers",
            absl::StrCat("has ", l->pp_layers_size(), " entries for learner.pp = ", pp, " stages",
                         interleaved ? absl::StrCat(" x learner.pp_virtual_stages = ", v) : ""));
  for (int i = 0; i < l->pp_layers_size(); ++i) {
    c.Require(l->pp_layers(i) >= 1, absl::StrCat("learner.pp_layers[", i, "]"), "must be >= 1");
  }
  if (pp == 1) return;
  const char* why = " with learner.pp > 1 is not built";
  c.Require(!l->sequence_parallel(), "learner.sequence_parallel",
            absl::StrCat("true", why, " (the stages pass each other the replicated stream)"));
  c.Require(l->ep() <= 1, "learner.ep", absl::StrCat("> 1", why));
  c.Require(l->zero() != 3, "learner.zero",
            absl::StrCat("3", why, " (plain data parallelism and ZeRO-1 over the replicas are)"));
  c.Require(l->autocast().empty() || l->autocast() == "fp32", "learner.autocast", absl::StrCat("bf16", why));
  c.Require(config->model().device().empty() || config->model().device() == "cpu", "learner.pp",
            "pipeline parallelism runs on the CPU so far (Gloo point to point)");
  c.Require(config->model().lora().rank() <= 0, "model.lora", absl::StrCat("set", why));
  for (int i = 0; i < config->stages_size(); ++i) {
    const Stage& st = config->stages(i);
    const std::string p = absl::StrCat("stages[", i, "]");
    c.Require(st.has_sft() || st.has_grpo() || st.has_dpo(), p,
              "learner.pp > 1 is built for sft, grpo and dpo stages (not ppo or reward_model)");
    c.Require(!st.has_grpo() || st.grpo().rl().distillation().teacher().empty(), p + ".grpo.rl.distillation",
              "teacher with learner.pp > 1 is not built");
  }
}

// learner.cp: what context parallelism is built for.
void CheckContextParallel(Checker& c, ExperimentConfig* config) {
  LearnerConfig* l = config->mutable_learner();
  if (l->cp() == 0) l->set_cp(1);
  const int cp = l->cp();
  const int others = std::max(1, l->tp()) * std::max(1, l->pp());
  c.Require(cp >= 1 && cp * others <= l->shards() && l->shards() % (cp * others) == 0, "learner.cp",
            absl::StrCat("must divide learner.shards (", l->shards(), ")",
                         others > 1 ? absl::StrCat(" with learner.tp x learner.pp (", cp * others,
                                                   " ranks per replica)")
                                    : ""));
  if (cp == 1) return;
  const char* why = " with learner.cp > 1 is not built";
  c.Require(!l->sequence_parallel(), "learner.sequence_parallel", absl::StrCat("true", why));
  c.Require(l->pp() <= 1, "learner.pp", absl::StrCat("> 1", why));
  c.Require(l->ep() <= 1, "learner.ep", absl::StrCat("> 1", why));
  c.Require(l->zero() != 3, "learner.zero", absl::StrCat("3", why, " (plain data parallelism and ZeRO-1 are)"));
  c.Require(l->autocast().empty() || l->autocast() == "fp32", "learner.autocast", absl::StrCat("bf16", why));
  c.Require(config->model().device().empty() || config->model().device() == "cpu", "learner.cp",
            "context parallelism runs on the CPU so far (Gloo)");
  c.Require(config->model().lora().rank() <= 0, "model.lora", absl::StrCat("set", why));
  for (int i = 0; i < config->stages_size(); ++i) {
    const Stage& st = config->stages(i);
    const std::string p = absl::StrCat("stages[", i, "]");
    c.Require(st.has_sft() || st.has_grpo() || st.has_dpo(), p,
              "learner.cp > 1 is built for sft, grpo and dpo stages (not ppo or reward_model)");
  }
}

// learner: shards, layouts, memory caps and micro-batches.
void CheckLearner(Checker& c, ExperimentConfig* config) {
  LearnerConfig* l = config->mutable_learner();
  const ModelConfig* m = &config->model();
  const RolloutConfig* r = &config->rollout();
  const std::string rollout_device = RolloutDevice(*config);
  if (l->shards() == 0) l->set_shards(1);
  c.Require(l->shards() > 0 && l->shards() <= 64, "learner.shards", "must be in [1, 64]");
  c.Require(l->zero() == 0 || l->zero() == 1 || l->zero() == 3, "learner.zero",
            "must be 0, 1 or 3 (ZeRO-2 is not built)");
  c.Require(l->zero() != 3 || config->model().device().empty() || config->model().device() == "cpu",
            "learner.zero", "3 runs on the CPU so far (its shards are built on the host)");
  if (l->tp() == 0) l->set_tp(1);
  c.Require(l->tp() >= 1 && l->tp() <= l->shards() && l->shards() % l->tp() == 0, "learner.tp",
            absl::StrCat("must divide learner.shards (", l->shards(), ")"));
  c.Require(l->tp() == 1 || l->autocast().empty() || l->autocast() == "fp32", "learner.autocast",
            "bf16 with learner.tp > 1 is not built");
  c.Require(l->tp() == 1 || config->model().device().empty() || config->model().device() == "cpu", "learner.tp",
            "tensor parallelism runs on the CPU so far (Gloo; its NCCL path is untested)");
  c.Require(!l->sequence_parallel() || l->tp() > 1, "learner.sequence_parallel", "needs learner.tp > 1");
  c.Require(!l->sequence_parallel() || l->zero() != 3, "learner.sequence_parallel",
            "with learner.zero: 3 is not built (ZeRO-3 over tensor-parallel slices keeps the stream replicated)");
  CheckPipeline(c, config);
  CheckContextParallel(c, config);
  if (l->ep() == 0) l->set_ep(1);
  c.Require(l->ep() >= 1 && l->ep() <= l->shards() && l->shards() % l->ep() == 0, "learner.ep",
            absl::StrCat("must divide learner.shards (", l->shards(), ")"));
  c.Require(l->ep() == 1 || m->init() != "scratch", "learner.ep",
            "needs a policy with MoE layers; a scratch model (model.arch " + m->arch() + ") has none");
  c.Require(l->ep() == 1 || (l->tp() == 1 && l->zero() == 0), "learner.ep",
            "expert parallelism with learner.tp > 1 or learner.zero: 1/3 is not built");
  c.Require(l->ep() == 1 || l->autocast().empty() || l->autocast() == "fp32", "learner.autocast",
            "bf16 with learner.ep > 1 is not built");
  c.Require(l->ep() == 1 || config->model().device().empty() || config->model().device() == "cpu", "learner.ep",
            "expert parallelism runs on the CPU so far (Gloo; its NCCL path is untested)");
  c.Require(!l->gradient_checkpointing() || l->ep() == 1, "learner.gradient_checkpointing",
            "with learner.ep > 1 is not built (not for MoE policies)");
  c.Require(l->sleep().empty() || l->sleep() == "off" || l->sleep() == "cache", "learner.sleep",
            "must be off or cache");
  c.Require(l->autocast().empty() || l->autocast() == "fp32" || l->autocast() == "bf16", "learner.autocast",
            "must be fp32 or bf16");
  c.Require(l->cuda_memory_fraction() >= 0 && l->cuda_memory_fraction() <= 1, "learner.cuda_memory_fraction",
            "must be in (0, 1] (0 = no cap)");
  c.Require(l->cuda_memory_fraction() == 0 || (!m->device().empty() && m->device() != "cpu"),
            "learner.cuda_memory_fraction", "set but the learners train on the CPU (model.device)");
  {
    // `coordinator run` puts learner 0 on model.device (the others on the
    // GPUs after it: PlaceLearnerShardsOnGpus) and every worker on
    // rollout.device: their caps share that GPU when the two are one.
    const absl::StatusOr<int> learner_gpu = ParseDeviceSpec(m->device(), "model.device");
    const absl::StatusOr<int> rollout_gpu = ParseDeviceSpec(rollout_device, "rollout.device");
    if (learner_gpu.ok() && rollout_gpu.ok() && *learner_gpu >= 0 && *learner_gpu == *rollout_gpu) {
      const double sum = l->cuda_memory_fraction() + r->workers() * r->cuda_memory_fraction();
      c.Require(sum <= 1 + 1e-9, "rollout.cuda_memory_fraction",
                absl::StrCat("learner.cuda_memory_fraction + rollout.workers x rollout.cuda_memory_fraction = ", sum,
                             " > 1 on the GPU that learner 0 and the workers share"));
    }
    if (learner_gpu.ok() && *learner_gpu >= 0) {
      c.Require(*learner_gpu + l->shards() <= kMaxCudaDevices, "learner.shards",
                absl::StrCat(l->shards(), " shards from GPU ", *learner_gpu, " (model.device) need GPUs up to ",
                             *learner_gpu + l->shards() - 1, ", past the last index ", kMaxCudaDevices - 1));
    }
  }
  if (l->micro_batch_tokens() == 0) l->set_micro_batch_tokens(8192);
  c.Require(l->micro_batch_tokens() > 0, "learner.micro_batch_tokens", "must be > 0");
}

// buffer, weight_sync, checkpoint, eval and run_dir.
void CheckRunSettings(Checker& c, ExperimentConfig* config) {
  const BufferConfig& b = config->buffer();
  c.Require(b.sample_mode().empty() || b.sample_mode() == "fifo" || b.sample_mode() == "uniform" ||
                b.sample_mode() == "prioritized",
            "buffer.sample_mode", "must be fifo, uniform or prioritized");
  c.Require(b.keep_steps() >= 0, "buffer.keep_steps", "must be >= 0");
  c.Require(b.max_bytes() >= 0, "buffer.max_bytes", "must be >= 0");
  c.Require(config->weight_sync().bucket_mb() >= 0 && config->weight_sync().bucket_mb() <= 4096,
            "weight_sync.bucket_mb", "must be in [0, 4096] (0 = 64)");
  if (config->weight_sync().fallback().empty()) config->mutable_weight_sync()->set_fallback("none");
  c.Require(config->weight_sync().fallback() == "none" || config->weight_sync().fallback() == "checkpoint",
            "weight_sync.fallback", "must be none or checkpoint");
  c.Require(config->weight_sync().timeout_ms() >= 0 && config->weight_sync().timeout_ms() <= 3'600'000,
            "weight_sync.timeout_ms", "must be in [0, 3600000] (an hour)");

  c.Require(config->checkpoint().keep() >= 0, "checkpoint.keep", "must be >= 0 (0 = the default 3)");
  if (config->checkpoint().keep() == 0) config->mutable_checkpoint()->set_keep(3);
  c.Require(config->checkpoint().every() >= 0, "checkpoint.every", "must be >= 0");
  c.Require(config->eval().every() >= 0, "eval.every", "must be >= 0");
  c.Require(config->eval().prompts() >= 0, "eval.prompts", "must be >= 0");
  for (int i = 0; i < config->eval().pass_at_size(); ++i) {
    c.Require(config->eval().pass_at(i) >= 1 && config->eval().pass_at(i) <= 64, absl::StrCat("eval.pass_at[", i, "]"),
              "must be in [1, 64]");
  }
  if (config->run_dir().empty()) config->set_run_dir("runs");
}

// model.lora: the adapters' shape, and the layouts and stages they run with.
void CheckLora(Checker& c, ExperimentConfig* config) {
  LoraConfig* lora = config->mutable_model()->mutable_lora();
  if (lora->rank() == 0) {
    c.Require(lora->alpha() == 0 && lora->dropout() == 0 && lora->targets_size() == 0 && lora->init().empty() &&
                  lora->stages_size() == 0 && lora->path().empty(),
              "model.lora.rank", "required (> 0) when any other model.lora field is set");
    return;
  }
  c.Require(lora->rank() > 0 && lora->rank() <= 1024, "model.lora.rank", "must be in [1, 1024] (0 = off)");
  if (lora->alpha() == 0) lora->set_alpha(static_cast<float>(lora->rank()));
  c.Require(lora->alpha() > 0 && std::isfinite(lora->alpha()), "model.lora.alpha", "must be > 0 (0 = rank)");
  c.Require(lora->dropout() >= 0 && lora->dropout() < 1, "model.lora.dropout", "must be in [0, 1)");
  if (lora->init().empty()) lora->set_init("default");
  c.Require(lora->init() == "default" || lora->init() == "gaussian", "model.lora.init", "must be default or gaussian");
  if (lora->targets_size() == 0) {
    for (const char* t : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
      lora->add_targets(t);
    }
  }
  std::set<std::string> seen;
  for (int i = 0; i < lora->targets_size(); ++i) {
    const std::string& t = lora->targets(i);
    const std::string p = absl::StrCat("model.lora.targets[", i, "]");
    c.Require(t == "q_proj" || t == "k_proj" || t == "v_proj" || t == "o_proj" || t == "gate_proj" ||
                  t == "up_proj" || t == "down_proj",
              p, "must be one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
    c.Require(seen.insert(t).second, p, "named twice");
  }
  seen.clear();
  for (int i = 0; i < lora->stages_size(); ++i) {
    const std::string& k = lora->stages(i);
    const std::string p = absl::StrCat("model.lora.stages[", i, "]");
    c.Require(k == "sft" || k == "dpo" || k == "grpo" || k == "ppo", p,
              "must be sft, dpo, grpo or ppo (a reward model trains its whole network)");
    c.Require(seen.insert(k).second, p, "named twice");
  }
  const LearnerConfig& l = config->learner();
  const char* why = " with model.lora is not built (LoRA runs with plain data parallelism and learner.zero: 1)";
  c.Require(l.tp() == 1, "learner.tp", absl::StrCat("> 1", why));
  c.Require(l.ep() == 1, "learner.ep", absl::StrCat("> 1", why));
  c.Require(l.zero() != 3, "learner.zero", absl::StrCat("3", why));
  c.Require(config->rollout().tp() <= 1, "rollout.tp",
            "> 1 with model.lora is not built (the workers' tensor-parallel model carries no adapters)");
  c.Require(config->rollout().sleep() != "weights", "rollout.sleep",
            "weights with model.lora is not built (a sync carries only the adapters, so the base must stay)");
  bool trains = false;
  for (int i = 0; i < config->stages_size(); ++i) {
    const Stage& st = config->stages(i);
    if (!LoraTrains(*config, st)) continue;
    trains = true;
    const std::string p = absl::StrCat("stages[", i, "]");
    c.Require(!st.has_reward_model(), p,
              "a reward_model stage trains its whole network: list the stages that train adapters in "
              "model.lora.stages");
    c.Require(lora->dropout() == 0 || RlSettings(st) == nullptr, "model.lora.dropout",
              absl::StrCat("must be 0 for RL stages (", p,
                           "): the importance ratio compares passes that dropout would make differ"));
  }
  c.Require(trains, "model.lora.stages", "names no stage of this experiment");
}

// stages: each stage's kind and its settings.
void CheckStages(Checker& c, ExperimentConfig* config) {
  const ModelConfig* m = &config->model();
  const RolloutConfig* r = &config->rollout();
  const SamplingParams* s = &r->sampling();
  const LearnerConfig* l = &config->learner();
  const BufferConfig& b = config->buffer();
  for (int i = 0; i < config->stages_size(); ++i) {
    Stage* st = config->mutable_stages(i);
    const std::string p = absl::StrCat("stages[", i, "]");
    // A policy with a value head (a reward model) runs through the sharded
    // units and the tensor-parallel model, not the expert-parallel one yet.
    c.Require(l->ep() == 1 || !st->has_reward_model(), p,
              "learner.ep > 1 is built for sft, dpo, grpo and ppo stages (a policy with a value head does not "
              "run through the expert-parallel model yet)");
    switch (st->kind_case()) {
      case Stage::kSft:
        c.Require(st->sft().steps() > 0, p + ".sft.steps", "must be > 0");
        c.Require(st->sft().batch() > 0, p + ".sft.batch", "must be > 0");
        CheckOptimizer(c, st->mutable_sft()->mutable_optimizer(), p + ".sft.optimizer");
        c.Require(st->sft().until().eval_accuracy() >= 0 && st->sft().until().eval_accuracy() <= 1,
                  p + ".sft.until.eval_accuracy", "must be in [0, 1] (0 = no stop rule)");
        c.Require(st->sft().until().every() >= 0, p + ".sft.until.every", "must be >= 0");
        c.Require(st->sft().until().after() >= 0, p + ".sft.until.after", "must be >= 0");
        break;
      case Stage::kGrpo: {
        c.Require(!RolloutSleeps(*r) || st->grpo().rl().max_staleness() == 0, "rollout.sleep",
                  absl::StrCat("needs synchronous RL (", p, ".grpo.rl.max_staleness > 0 generates while the "
                               "learner trains)"));
        const std::string& adv = st->grpo().advantage();
        c.Require(adv.empty() || adv == "grpo" || adv == "dr_grpo" || adv == "rloo" || adv == "reinforce_pp",
                  p + ".grpo.advantage", "must be grpo, dr_grpo, rloo or reinforce_pp");
        if (adv.empty()) st->mutable_grpo()->set_advantage("grpo");
        CheckRl(c, st->mutable_grpo()->mutable_rl(), p + ".grpo.rl", adv != "reinforce_pp",
                adv == "dr_grpo" ? "seq-mean-token-sum-norm" : "token-mean", s->max_new_tokens());
        // Under context parallelism a rank holds part of each sequence.
        c.Require(l->cp() <= 1 || st->grpo().rl().loss_agg() == "token-mean", p + ".grpo.rl.loss_agg",
                  "must be token-mean with learner.cp > 1 (a per-sequence mean needs every rank's tokens)");
        c.Require(l->cp() <= 1 || st->grpo().rl().policy_loss() != "gspo", p + ".grpo.rl.policy_loss",
                  "gspo with learner.cp > 1 is not built (its ratio is per sequence)");
        // The learner takes a refill step's groups first-in first-out: a
        // uniform or prioritized draw would mix in other steps' groups.
        c.Require(st->grpo().rl().dynamic_sampling().mode() != "refill" || b.sample_mode().empty() ||
                      b.sample_mode() == "fifo",
                  p + ".grpo.rl.dynamic_sampling.mode", "refill needs buffer.sample_mode fifo");
        break;
      }
      case Stage::kPpo:
        c.Require(!RolloutSleeps(*r) || st->ppo().rl().max_staleness() == 0, "rollout.sleep",
                  absl::StrCat("needs synchronous RL (", p, ".ppo.rl.max_staleness > 0 generates while the "
                               "learner trains)"));
        CheckRl(c, st->mutable_ppo()->mutable_rl(), p + ".ppo.rl", false, "token-mean", s->max_new_tokens());
        c.Require(st->ppo().rl().distillation().teacher().empty(), p + ".ppo.rl.distillation",
                  "only GRPO-family stages distil (not built for PPO's critic)");
        c.Require(st->ppo().rl().dynamic_sampling().mode() != "refill" || b.sample_mode().empty() ||
                      b.sample_mode() == "fifo",
                  p + ".ppo.rl.dynamic_sampling.mode", "refill needs buffer.sample_mode fifo");
        if (st->ppo().gamma() == 0) st->mutable_ppo()->set_gamma(1.0);
        if (st->ppo().lam() == 0) st->mutable_ppo()->set_lam(0.95);
        if (st->ppo().value_clip() == 0) st->mutable_ppo()->set_value_clip(0.2);
        if (st->ppo().vf_coef() == 0) st->mutable_ppo()->set_vf_coef(0.5);
        c.Require(st->ppo().gamma() > 0 && st->ppo().gamma() <= 1, p + ".ppo.gamma",
                  "must be in (0, 1] (0 = the default 1)");
        c.Require(st->ppo().lam() > 0 && st->ppo().lam() <= 1, p + ".ppo.lam", "must be in (0, 1] (0 = the default 0.95)");
        c.Require(st->ppo().value_clip() > 0 && std::isfinite(st->ppo().value_clip()), p + ".ppo.value_clip",
                  "must be > 0 (0 = the default 0.2)");
        c.Require(st->ppo().vf_coef() > 0 && std::isfinite(st->ppo().vf_coef()), p + ".ppo.vf_coef",
                  "must be > 0 (0 = the default 0.5)");
        if (st->ppo().has_critic_optimizer()) {
          CheckOptimizer(c, st->mutable_ppo()->mutable_critic_optimizer(), p + ".ppo.critic_optimizer");
        }
        break;
      case Stage::kDpo:
        c.Require(st->dpo().steps() > 0, p + ".dpo.steps", "must be > 0");
        c.Require(st->dpo().batch() > 0, p + ".dpo.batch", "must be > 0");
        CheckOptimizer(c, st->mutable_dpo()->mutable_optimizer(), p + ".dpo.optimizer");
        if (st->dpo().beta() == 0) st->mutable_dpo()->set_beta(0.1);
        c.Require(st->dpo().beta() > 0 && std::isfinite(st->dpo().beta()), p + ".dpo.beta", "must be > 0 (0 = the default 0.1)");
        break;
      case Stage::kRewardModel:
        c.Require(st->reward_model().steps() > 0, p + ".reward_model.steps", "must be > 0");
        c.Require(st->reward_model().batch() > 0, p + ".reward_model.batch", "must be > 0");
        CheckOptimizer(c, st->mutable_reward_model()->mutable_optimizer(), p + ".reward_model.optimizer");
        break;
      default:
        c.Require(false, p, "names no stage kind (sft, grpo, ppo, dpo, reward_model)");
    }
    // MoE settings need MoE layers. A scratch model is llama/qwen2/qwen3
    // (dense); a checkpoint's architecture is known only to the learner,
    // which refuses there (learner/stage_options.cc, CheckMoeSettings).
    const RlStage* rl = RlSettings(*st);
    if (rl != nullptr && (!config->environment().address().empty() || config->environment().launch())) {
      // Multi-turn episodes are assembled from several generations; their
      // routes are not stitched together (yet).
      c.Require(!rl->routing_replay(), absl::StrCat(p, ".", StageKind(*st), ".rl.routing_replay"),
                "not supported with multi-turn rollouts (environment.address)");
    }
    if (rl != nullptr && m->init() == "scratch") {
      const std::string rp = absl::StrCat(p, ".", StageKind(*st), ".rl");
      c.Require(!rl->routing_replay(), rp + ".routing_replay",
                "needs a policy with MoE layers; a scratch model (model.arch " + m->arch() + ") has none");
      c.Require(!rl->has_router_aux_loss_coef(), rp + ".router_aux_loss_coef",
                "needs a policy with MoE layers; a scratch model (model.arch " + m->arch() + ") has none");
    }
  }
}

}  // namespace

std::string StageKind(const Stage& stage) {
  switch (stage.kind_case()) {
    case Stage::kSft: return "sft";
    case Stage::kRewardModel: return "reward_model";
    case Stage::kDpo: return "dpo";
    case Stage::kPpo: return "ppo";
    case Stage::kGrpo: return "grpo";
    default: return "";
  }
}

std::string StageName(const Stage& stage) { return stage.name().empty() ? StageKind(stage) : stage.name(); }

const RlStage* RlSettings(const Stage& stage) {
  if (stage.has_grpo()) return &stage.grpo().rl();
  if (stage.has_ppo()) return &stage.ppo().rl();
  return nullptr;
}

bool LoraTrains(const ExperimentConfig& experiment, const Stage& stage) {
  const LoraConfig& lora = experiment.model().lora();
  if (lora.rank() <= 0) return false;
  if (lora.stages_size() == 0) return true;
  const std::string kind = StageKind(stage);
  for (const std::string& k : lora.stages()) {
    if (k == kind) return true;
  }
  return false;
}

bool RolloutSleeps(const RolloutConfig& rollout) {
  return rollout.sleep() == "cache" || rollout.sleep() == "weights";
}

absl::Status NormalizeExperiment(ExperimentConfig* config, const YamlSource& source) {
  Checker c(source);
  CheckName(c, config);
  CheckModel(c, config);
  CheckTask(c, *config);
  // The rollout's defaults (max_new_tokens) come before the stages that
  // read them.
  CheckRollout(c, config);
  CheckEnvironment(c, config);
  CheckReward(c, config);
  CheckLearner(c, config);
  CheckRunSettings(c, config);
  CheckStages(c, config);
  CheckLora(c, config);
  return c.status();
}

}  // namespace rlmesh
