#include "learner/trainer.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actor/checkpoint.h"
#include "actor/logprobs.h"
#include "actor/safetensors.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "common/atomic_file.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "learner/advantages.h"
#include "learner/checkpoint.h"
#include "learner/losses.h"
#include "learner/schedule.h"
#include "tasks/encoding.h"
#include "tasks/preferences.h"
#include "tasks/task.h"

namespace rlmesh::learner {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Model construction draws from LibTorch's global generator; trainers running
// as threads of one process (tests) must not interleave there.
std::mutex& InitMutex() {
  static std::mutex mu;
  return mu;
}

// Runs `fn`, turning LibTorch/STL exceptions into INTERNAL.
template <typename Fn>
auto CatchAll(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

absl::Status Prefix(const std::string& prefix, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, ".", s.message()));
}

// Rank r's contiguous share of a global batch of groups: [r*G/K, (r+1)*G/K).
std::vector<TrajectoryGroup> RankSlice(std::vector<TrajectoryGroup> all, int rank, int world) {
  const int64_t G = static_cast<int64_t>(all.size());
  const int64_t lo = rank * G / world, hi = (rank + 1) * G / world;
  return std::vector<TrajectoryGroup>(std::make_move_iterator(all.begin() + lo),
                                      std::make_move_iterator(all.begin() + hi));
}

// splitmix64: derives independent seeds from (seed, salt).
uint64_t Mix(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (salt + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct Optim {
  AdamWOptions adamw;
  LrScheduleOptions schedule;
  // < 0: no clipping.
  double grad_clip = 1.0;
};

// OptimizerConfig (zero = the documented default) -> options; errors name
// `field`.
absl::StatusOr<Optim> MakeOptim(const OptimizerConfig& c, const std::string& field,
                                int64_t total_steps) {
  Optim o;
  if (!(c.lr() > 0)) return absl::InvalidArgumentError(field + ".lr: must be > 0");
  o.adamw.beta1 = c.beta1() == 0 ? 0.9 : c.beta1();
  o.adamw.beta2 = c.beta2() == 0 ? 0.999 : c.beta2();
  o.adamw.eps = c.eps() == 0 ? 1e-8 : c.eps();
  o.adamw.weight_decay = c.weight_decay();
  RLMESH_RETURN_IF_ERROR(Prefix(field, o.adamw.Validate()));
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
  RLMESH_RETURN_IF_ERROR(Prefix(field, o.schedule.Validate()));
  if (c.warmup_steps() < 0) return absl::InvalidArgumentError(field + ".warmup_steps: must be >= 0");
  o.grad_clip = c.grad_clip() == 0 ? 1.0 : c.grad_clip();
  return o;
}

// One tokenised training sequence.
struct Seq {
  std::vector<int64_t> ids;
  // Per position t (predicting ids[t+1]): loss weight, behaviour log-prob.
  std::vector<float> mask;
  std::vector<float> behaviour;
};

// A padded batch of sequences: [B, T] tensors (T = longest sequence).
struct Batch {
  at::Tensor input_ids, positions, targets, mask, behaviour;
  // Packed batches only: segment id per position (1, 2, ... per sequence in
  // the row; 0 = padding), the attention mask that keeps them apart.
  at::Tensor segments;
  int64_t tokens = 0;  // real tokens (sum of lengths)
};

// SFT packing: the sequences, in order, first-fit into rows of at most
// `row_len` tokens; positions restart and targets stop at each sequence's
// end, so every sequence sees and predicts exactly what it would alone.
// `row_lengths` gets each row's used length.
Batch MakePackedBatch(const std::vector<Seq>& seqs, int64_t row_len, std::vector<int64_t>* row_lengths) {
  std::vector<std::vector<const Seq*>> rows;
  row_lengths->clear();
  for (const Seq& s : seqs) {
    const int64_t L = s.ids.size();
    size_t r = 0;
    while (r < rows.size() && (*row_lengths)[r] + L > row_len) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      row_lengths->push_back(0);
    }
    rows[r].push_back(&s);
    (*row_lengths)[r] += L;
  }
  int64_t T = 1;
  for (int64_t l : *row_lengths) T = std::max(T, l);
  const int64_t B = rows.size();
  Batch b;
  b.input_ids = at::zeros({B, T}, at::kLong);
  b.positions = at::zeros({B, T}, at::kLong);
  b.targets = at::full({B, T}, -1, at::kLong);
  b.mask = at::zeros({B, T}, at::kFloat);
  b.segments = at::zeros({B, T}, at::kLong);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto pos = b.positions.accessor<int64_t, 2>();
  auto tg = b.targets.accessor<int64_t, 2>();
  auto m = b.mask.accessor<float, 2>();
  auto seg = b.segments.accessor<int64_t, 2>();
  for (int64_t r = 0; r < B; ++r) {
    int64_t at = 0, id = 0;
    for (const Seq* s : rows[r]) {
      ++id;
      const int64_t L = s->ids.size();
      b.tokens += L;
      for (int64_t t = 0; t < L; ++t) {
        ids[r][at + t] = s->ids[t];
        pos[r][at + t] = t;
        seg[r][at + t] = id;
        if (t + 1 < L) tg[r][at + t] = s->ids[t + 1];
        if (t < static_cast<int64_t>(s->mask.size())) m[r][at + t] = s->mask[t];
      }
      at += L;
    }
  }
  return b;
}

Batch MakeBatch(const std::vector<Seq>& seqs, bool with_behaviour) {
  int64_t T = 1;
  for (const Seq& s : seqs) T = std::max<int64_t>(T, s.ids.size());
  const int64_t B = seqs.size();
  Batch b;
  b.input_ids = at::zeros({B, T}, at::kLong);
  b.targets = at::full({B, T}, -1, at::kLong);
  b.mask = at::zeros({B, T}, at::kFloat);
  if (with_behaviour) b.behaviour = at::zeros({B, T}, at::kFloat);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto tg = b.targets.accessor<int64_t, 2>();
  auto m = b.mask.accessor<float, 2>();
  for (int64_t r = 0; r < B; ++r) {
    const Seq& s = seqs[r];
    const int64_t L = s.ids.size();
    b.tokens += L;
    for (int64_t t = 0; t < L; ++t) {
      ids[r][t] = s.ids[t];
      if (t + 1 < L) tg[r][t] = s.ids[t + 1];
      if (t < static_cast<int64_t>(s.mask.size())) m[r][t] = s.mask[t];
    }
    if (with_behaviour) {
      auto bh = b.behaviour.accessor<float, 2>();
      for (int64_t t = 0; t < static_cast<int64_t>(s.behaviour.size()); ++t) bh[r][t] = s.behaviour[t];
    }
  }
  b.positions = at::arange(T, at::kLong).unsqueeze(0).expand({B, T}).contiguous();
  return b;
}

// Rows [begin, end) of `full`, narrowed to the longest row among them.
at::Tensor Rows(const at::Tensor& full, int64_t begin, int64_t end, int64_t T) {
  return full.narrow(0, begin, end - begin).narrow(1, 0, T);
}

// Contiguous micro-batches of rows [begin, end): each has at most
// `max_tokens` padded tokens (rows x longest row), and at least one row.
std::vector<std::pair<int64_t, int64_t>> MicroBatches(const std::vector<int64_t>& lengths,
                                                      int64_t begin, int64_t end,
                                                      int64_t max_tokens) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = begin, longest = 0;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t l = std::max<int64_t>(longest, lengths[r]);
    if (r > start && (r - start + 1) * l > max_tokens) {
      out.emplace_back(start, r);
      start = r;
      longest = lengths[r];
    } else {
      longest = l;
    }
  }
  if (end > start) out.emplace_back(start, end);
  return out;
}

// Weighted means of metrics over micro-batches.
class MetricMeans {
 public:
  void Add(const Metrics& m, double w) {
    for (const auto& [k, v] : m) {
      auto& [num, den] = acc_[k];
      num += v * w;
      den += w;
    }
  }
  void Into(std::map<std::string, double>* out) const {
    for (const auto& [k, nd] : acc_) {
      if (nd.second > 0) (*out)[k] = nd.first / nd.second;
    }
  }

 private:
  std::map<std::string, std::pair<double, double>> acc_;
};

}  // namespace

absl::Status TrainerOptions::Validate() const {
  if (logprob_chunk < 1) return absl::InvalidArgumentError("logprob_chunk: must be >= 1");
  if (sample_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("sample_timeout: must be > 0");
  }
  if (store_timeout_ms < 1) return absl::InvalidArgumentError("store_timeout_ms: must be >= 1");
  return gloo.Validate();
}

// bf16 autocast over a forward pass (learner.autocast: bf16): matmuls run in
// bf16, reductions such as log_softmax in fp32, master weights stay fp32.
// Restores the previous autocast state of the device type on exit.
class AutocastScope {
 public:
  AutocastScope(bool on, c10::DeviceType device_type) : on_(on), device_type_(device_type) {
    if (!on_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(device_type_);
    prev_dtype_ = at::autocast::get_autocast_dtype(device_type_);
    at::autocast::set_autocast_enabled(device_type_, true);
    at::autocast::set_autocast_dtype(device_type_, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, prev_enabled_);
    at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  const bool on_;
  const c10::DeviceType device_type_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

struct Trainer::State {
  ConfigureRequest request;
  std::string kind;        // "sft", "reward_model", "dpo", "grpo" or "ppo"
  std::string stage_name;  // display name
  int rank = 0, world = 1;
  bool zero1 = false;
  // learner.autocast == "bf16": forward passes under bf16 autocast.
  bool autocast_bf16 = false;
  c10::DeviceType device_type = c10::DeviceType::CPU;

  absl::StatusOr<actor::TokenLogProbsOutput> LogProbs(actor::Transformer& m, const at::Tensor& ids,
                                                      const at::Tensor& pos, const at::Tensor& targets, int64_t chunk,
                                                      double temperature, const at::Tensor& attention_mask = {}) {
    AutocastScope ac(autocast_bf16, device_type);
    return actor::TokenLogProbs(m, ids, pos, targets, chunk, temperature, attention_mask);
  }
  at::Tensor Values(actor::Transformer& m, const at::Tensor& ids, const at::Tensor& pos) {
    AutocastScope ac(autocast_bf16, device_type);
    return m->Values(ids, pos).to(at::kFloat);
  }
  int64_t micro_tokens = 8192;

  std::unique_ptr<actor::Tokenizer> tokenizer;
  std::unique_ptr<Task> task;
  uint64_t loader_seed = 0;
  std::unique_ptr<PromptLoader> loader;
  // What `loader` walks: the task's train split, or `pair_keys`.
  const std::vector<Example>* loader_data = nullptr;

  actor::Transformer policy{nullptr};
  actor::Transformer reference{nullptr};
  actor::Transformer critic{nullptr};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> group;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<DataParallel> critic_dp;
  Optim optim, critic_optim;

  // SFT.
  int sft_batch = 0;
  bool train_on_prompt = false;
  bool packing = false;

  // Reward model and DPO: the pairs, and one Example per pair (id = index)
  // for the loader.
  std::vector<PreferencePair> pairs;
  std::vector<Example> pair_keys;
  int pair_batch = 0;
  int64_t stage_steps = 0;
  double beta = 0.1;
  std::string rm_output;

  // RL.
  std::string advantage;  // grpo, dr_grpo, rloo, reinforce_pp, ppo
  PolicyLossOptions loss;
  double kl_coef = 0.0;
  bool kl_in_reward = false;
  KlEstimator kl_estimator = KlEstimator::kK3;
  double temperature = 1.0;
  int max_new_tokens = 0;
  int epochs = 1, mini_batches = 1;
  bool drop_zero_variance = false;
  int overlong_buffer = 0;
  double overlong_penalty = 0.0;
  GaeOptions gae;
  double value_clip = 0.2, vf_coef = 0.5;
};

Trainer::Trainer(TrainerOptions options) : options_(std::move(options)) { PublishStatus(); }
Trainer::~Trainer() = default;

void Trainer::PublishStatus() {
  LearnerStatus st;
  if (s_) {
    st.set_stage(s_->stage_name);
    st.set_rank(s_->rank);
    st.set_world_size(s_->world);
  } else {
    st.set_world_size(1);
  }
  st.set_step(step_);
  st.set_policy_version(version_);
  absl::MutexLock lock(&status_mu_);
  status_ = std::move(st);
}

LearnerStatus Trainer::Status() const {
  absl::MutexLock lock(&status_mu_);
  return status_;
}

std::vector<std::pair<std::string, at::Tensor>> Trainer::PolicyParameters() const {
  return s_->policy->NamedParameters();
}

void* Trainer::policy_model() { return s_ ? &s_->policy : nullptr; }

absl::StatusOr<ConfigureResponse> Trainer::Configure(const ConfigureRequest& req) {
  RLMESH_RETURN_IF_ERROR(options_.Validate());
  // Drop the previous stage first (its process group, models, memory).
  s_.reset();
  step_ = 0;
  version_ = 0;
  PublishStatus();

  auto st = std::make_unique<State>();
  State& s = *st;
  s.request = req;
  const ExperimentConfig& exp = s.request.experiment();
  if (req.world_size() < 1) return absl::InvalidArgumentError("world_size: must be >= 1");
  if (req.rank() < 0 || req.rank() >= req.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", req.rank(), " is outside [0, world_size=", req.world_size(), ")"));
  }
  if (req.world_size() > 1 && req.store_address().empty()) {
    return absl::InvalidArgumentError("store_address: required when world_size > 1");
  }
  if (req.stage_index() < 0 || req.stage_index() >= exp.stages_size()) {
    return absl::InvalidArgumentError(absl::StrCat("stage_index: ", req.stage_index(),
                                                   " is outside experiment.stages (size ",
                                                   exp.stages_size(), ")"));
  }
  s.rank = req.rank();
  s.world = req.world_size();
  const Stage& stage = exp.stages(req.stage_index());
  const std::string sp = absl::StrCat("experiment.stages[", req.stage_index(), "]");

  // Learner settings.
  if (exp.learner().zero() != 0 && exp.learner().zero() != 1) {
    return absl::InvalidArgumentError("experiment.learner.zero: must be 0 or 1");
  }
  s.zero1 = exp.learner().zero() == 1;
  if (exp.learner().micro_batch_tokens() < 0) {
    return absl::InvalidArgumentError("experiment.learner.micro_batch_tokens: must be >= 0");
  }
  s.micro_tokens = exp.learner().micro_batch_tokens() == 0 ? 8192 : exp.learner().micro_batch_tokens();
  if (!exp.learner().autocast().empty() && exp.learner().autocast() != "fp32" &&
      exp.learner().autocast() != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("experiment.learner.autocast: \"", exp.learner().autocast(),
                                                   "\" is not fp32 or bf16"));
  }
  s.autocast_bf16 = exp.learner().autocast() == "bf16";
  if (exp.checkpoint().keep() < 0) {
    return absl::InvalidArgumentError("experiment.checkpoint.keep: must be >= 0");
  }

  // Sampling temperature the rollout used: on-policy ratios are exactly 1
  // only if log-probs are recomputed at that temperature.
  const SamplingParams& sampling = exp.rollout().sampling();
  if (sampling.temperature() < 0) {
    return absl::InvalidArgumentError("experiment.rollout.sampling.temperature: must be >= 0");
  }
  s.temperature = (sampling.greedy() || sampling.temperature() == 0) ? 1.0 : sampling.temperature();
  s.max_new_tokens = sampling.max_new_tokens();

  // The stage.
  const RlStage* rl = nullptr;
  int64_t opt_steps = 0;
  // Steps and the global batch of an SFT/RM/DPO stage at `fp`.
  auto check_steps_batch = [&](const std::string& fp, int64_t steps, int64_t batch) -> absl::Status {
    if (steps <= 0) return absl::InvalidArgumentError(fp + ".steps: must be > 0");
    if (batch < s.world) {
      return absl::InvalidArgumentError(
          absl::StrCat(fp, ".batch: must be >= the learner world size (", s.world, ")"));
    }
    return absl::OkStatus();
  };
  switch (stage.kind_case()) {
    case Stage::kSft: {
      s.kind = "sft";
      const SftStage& sft = stage.sft();
      RLMESH_RETURN_IF_ERROR(check_steps_batch(sp + ".sft", sft.steps(), sft.batch()));
      s.packing = sft.packing();
      s.sft_batch = sft.batch();
      s.train_on_prompt = sft.train_on_prompt();
      RLMESH_ASSIGN_OR_RETURN(s.optim, MakeOptim(sft.optimizer(), sp + ".sft.optimizer", sft.steps()));
      break;
    }
    case Stage::kGrpo: {
      s.kind = "grpo";
      rl = &stage.grpo().rl();
      s.advantage = stage.grpo().advantage().empty() ? "grpo" : stage.grpo().advantage();
      if (s.advantage != "grpo" && s.advantage != "dr_grpo" && s.advantage != "rloo" &&
          s.advantage != "reinforce_pp") {
        return absl::InvalidArgumentError(
            absl::StrCat(sp, ".grpo.advantage: \"", s.advantage,
                         "\" is not grpo, dr_grpo, rloo or reinforce_pp"));
      }
      break;
    }
    case Stage::kPpo: {
      s.kind = "ppo";
      s.advantage = "ppo";
      rl = &stage.ppo().rl();
      const PpoStage& ppo = stage.ppo();
      s.gae.gamma = ppo.gamma() == 0 ? 1.0 : ppo.gamma();
      s.gae.lam = ppo.lam() == 0 ? 0.95 : ppo.lam();
      s.gae.whiten = !ppo.no_whiten();
      RLMESH_RETURN_IF_ERROR(Prefix(sp + ".ppo", s.gae.Validate()));
      if (ppo.value_clip() < 0) return absl::InvalidArgumentError(sp + ".ppo.value_clip: must be >= 0");
      s.value_clip = ppo.value_clip() == 0 ? 0.2 : ppo.value_clip();
      if (ppo.vf_coef() < 0) return absl::InvalidArgumentError(sp + ".ppo.vf_coef: must be >= 0");
      s.vf_coef = ppo.vf_coef() == 0 ? 0.5 : ppo.vf_coef();
      break;
    }
    case Stage::kRewardModel: {
      s.kind = "reward_model";
      const RewardModelStage& rm = stage.reward_model();
      const std::string fp = sp + ".reward_model";
      RLMESH_RETURN_IF_ERROR(check_steps_batch(fp, rm.steps(), rm.batch()));
      s.pair_batch = rm.batch();
      s.stage_steps = rm.steps();
      s.rm_output = rm.output();
      RLMESH_ASSIGN_OR_RETURN(s.optim, MakeOptim(rm.optimizer(), fp + ".optimizer", rm.steps()));
      break;
    }
    case Stage::kDpo: {
      s.kind = "dpo";
      const DpoStage& dpo = stage.dpo();
      const std::string fp = sp + ".dpo";
      RLMESH_RETURN_IF_ERROR(check_steps_batch(fp, dpo.steps(), dpo.batch()));
      if (dpo.beta() < 0 || !std::isfinite(dpo.beta())) {
        return absl::InvalidArgumentError(fp + ".beta: must be > 0 (0 = the default 0.1)");
      }
      s.beta = dpo.beta() == 0 ? 0.1 : dpo.beta();
      s.pair_batch = dpo.batch();
      s.stage_steps = dpo.steps();
      RLMESH_ASSIGN_OR_RETURN(s.optim, MakeOptim(dpo.optimizer(), fp + ".optimizer", dpo.steps()));
      break;
    }
    default:
      return absl::InvalidArgumentError(sp + ": no stage kind set (sft, grpo, ppo, ...)");
  }
  s.stage_name = stage.name().empty() ? s.kind : stage.name();
  if (rl != nullptr) {
    const std::string rp = sp + "." + s.kind + ".rl";
    if (rl->steps() <= 0) return absl::InvalidArgumentError(rp + ".steps: must be > 0");
    if (rl->epochs() < 0) return absl::InvalidArgumentError(rp + ".epochs: must be >= 0");
    if (rl->mini_batches() < 0) return absl::InvalidArgumentError(rp + ".mini_batches: must be >= 0");
    s.epochs = rl->epochs() == 0 ? 1 : rl->epochs();
    s.mini_batches = rl->mini_batches() == 0 ? 1 : rl->mini_batches();
    opt_steps = static_cast<int64_t>(rl->steps()) * s.epochs * s.mini_batches;
    RLMESH_ASSIGN_OR_RETURN(s.optim, MakeOptim(rl->optimizer(), rp + ".optimizer", opt_steps));
    if (rl->clip_low() < 0) return absl::InvalidArgumentError(rp + ".clip_low: must be >= 0");
    if (rl->clip_high() < 0) return absl::InvalidArgumentError(rp + ".clip_high: must be >= 0");
    s.loss.clip_low = rl->clip_low() == 0 ? 0.2 : rl->clip_low();
    s.loss.clip_high = rl->clip_high() == 0 ? s.loss.clip_low : rl->clip_high();
    s.loss.dual_clip = rl->dual_clip();
    // Zero means the default (2); a negative cap disables truncation.
    s.loss.importance_cap = rl->importance_cap() == 0 ? 2.0 : std::max(0.0, rl->importance_cap());
    s.loss.entropy_coef = rl->entropy_coef();
    if (rl->kl().coef() < 0) return absl::InvalidArgumentError(rp + ".kl.coef: must be >= 0");
    s.kl_coef = rl->kl().coef();
    s.kl_in_reward = rl->kl().in_reward();
    if (!rl->kl().estimator().empty()) {
      auto est = ParseKlEstimator(rl->kl().estimator());
      if (!est.ok()) return Prefix(rp + ".kl.estimator", est.status());
      s.kl_estimator = *est;
    }
    s.loss.kl_estimator = s.kl_estimator;
    s.loss.kl_coef = s.kl_in_reward ? 0.0 : s.kl_coef;
    std::string agg = rl->loss_agg();
    // Dr.GRPO: no length normalisation unless the config says otherwise.
    if (agg.empty()) agg = s.advantage == "dr_grpo" ? "seq-mean-token-sum-norm" : "token-mean";
    auto parsed = ParseLossAgg(agg);
    if (!parsed.ok()) return Prefix(rp + ".loss_agg", parsed.status());
    s.loss.agg = *parsed;
    // A constant normaliser, the same on every micro-batch and rank.
    s.loss.agg_normalizer = s.max_new_tokens > 0 ? s.max_new_tokens : 0;
    RLMESH_RETURN_IF_ERROR(Prefix(rp, s.loss.Validate()));
    s.drop_zero_variance = rl->drop_zero_variance();
    if (rl->overlong_buffer() < 0) return absl::InvalidArgumentError(rp + ".overlong_buffer: must be >= 0");
    if (rl->overlong_penalty() < 0) return absl::InvalidArgumentError(rp + ".overlong_penalty: must be >= 0");
    s.overlong_buffer = rl->overlong_buffer();
    s.overlong_penalty = rl->overlong_penalty();
    if (s.overlong_buffer > 0 && (s.max_new_tokens <= 0 || s.overlong_buffer > s.max_new_tokens)) {
      return absl::InvalidArgumentError(
          rp + ".overlong_buffer: needs 0 < overlong_buffer <= experiment.rollout.sampling.max_new_tokens");
    }
    if (s.kind == "ppo") {
      const OptimizerConfig& co = stage.ppo().critic_optimizer().lr() > 0 ? stage.ppo().critic_optimizer()
                                                                          : rl->optimizer();
      RLMESH_ASSIGN_OR_RETURN(s.critic_optim, MakeOptim(co, sp + ".ppo.critic_optimizer", opt_steps));
    }
  }

  // Tokenizer and task data.
  const ModelConfig& mc = exp.model();
  {
    auto tok = actor::LoadTokenizer(mc.tokenizer().empty() ? "char" : mc.tokenizer());
    if (!tok.ok()) return Prefix("experiment.model.tokenizer", tok.status());
    s.tokenizer = *std::move(tok);
  }
  if (s.kind == "sft") {
    auto task = MakeTask(exp.task(), exp.seed(), exp.model().tokenizer());
    if (!task.ok()) return Prefix("experiment.task", task.status());
    s.task = *std::move(task);
    if (s.task->train().empty()) return absl::InvalidArgumentError("experiment.task: no train examples");
    s.loader_seed = Mix(exp.seed(), static_cast<uint64_t>(req.stage_index()));
    s.loader_data = &s.task->train();
    s.loader = std::make_unique<PromptLoader>(s.loader_data, s.loader_seed);
  } else if (s.kind == "reward_model" || s.kind == "dpo") {
    const std::string& pairs_path =
        s.kind == "dpo" ? stage.dpo().pairs_path() : stage.reward_model().pairs_path();
    const std::string fp = absl::StrCat(sp, ".", s.kind, ".pairs_path");
    if (!pairs_path.empty()) {
      auto pairs = ReadPreferencePairs(pairs_path);
      if (!pairs.ok()) return Prefix(fp, pairs.status());
      s.pairs = *std::move(pairs);
    } else {
      // Pairs from the task's train split: the answer against a near miss.
      auto task = MakeTask(exp.task(), exp.seed(), exp.model().tokenizer());
      if (!task.ok()) return Prefix("experiment.task", task.status());
      TaskPairOptions po;
      po.seed = Mix(exp.seed(), 0x9a125);
      auto pairs = MakeTaskPreferencePairs((*task)->train(), po);
      if (!pairs.ok()) return Prefix(fp + " (empty: pairs from experiment.task)", pairs.status());
      s.pairs = *std::move(pairs);
    }
    if (s.pairs.empty()) return absl::InvalidArgumentError(fp + ": no pairs");
    s.pair_keys.resize(s.pairs.size());
    for (size_t i = 0; i < s.pairs.size(); ++i) s.pair_keys[i].id = absl::StrCat(i);
    s.loader_seed = Mix(exp.seed(), static_cast<uint64_t>(req.stage_index()));
    s.loader_data = &s.pair_keys;
    s.loader = std::make_unique<PromptLoader>(s.loader_data, s.loader_seed);
  }

  // The policy.
  const std::string dtype = mc.dtype().empty() ? "fp32" : mc.dtype();
  if (dtype != "fp32" && dtype != "float32") {
    return absl::InvalidArgumentError("experiment.model.dtype: the learner trains fp32 master weights");
  }
  const std::string device = mc.device().empty() ? "cpu" : mc.device();
  RLMESH_RETURN_IF_ERROR(CatchAll("experiment.model.device", [&]() -> absl::Status {
    s.device_type = torch::Device(device).type();
    return absl::OkStatus();
  }));
  std::string init_path = req.init_checkpoint();
  const std::string init = mc.init().empty() ? "scratch" : mc.init();
  if (init_path.empty() && init == "checkpoint") {
    if (mc.path().empty()) return absl::InvalidArgumentError("experiment.model.path: required when init is checkpoint");
    init_path = mc.path();
  } else if (init_path.empty() && init != "scratch") {
    return absl::InvalidArgumentError(
        absl::StrCat("experiment.model.init: \"", init, "\" is not scratch or checkpoint"));
  }
  actor::ModelConfig cfg;
  const bool reward_model = s.kind == "reward_model";
  if (!init_path.empty()) {
    actor::LoadOptions lo;
    lo.device = device;
    if (reward_model) {
      // A reward model starts from a policy: its scalar head is fresh
      // (seeded), or read back when the checkpoint already has one.
      lo.add_value_head = true;
      lo.allow_missing_value_head = true;
    }
    absl::StatusOr<actor::Transformer> model = absl::UnknownError("not loaded");
    {
      std::lock_guard<std::mutex> lock(InitMutex());
      torch::manual_seed(Mix(exp.seed(), 0x5c0e));
      model = actor::LoadHfModel(init_path, lo);
    }
    if (!model.ok()) return Prefix("init_checkpoint", model.status());
    s.policy = *std::move(model);
    cfg = s.policy->config();
    // Versions increase over the stages of an experiment.
    auto prev = VerifyCheckpoint(init_path);
    if (prev.ok()) version_ = prev->policy_version;
  } else {
    cfg.arch = mc.arch().empty() ? "llama" : mc.arch();
    cfg.vocab_size = s.tokenizer->vocab_size();
    cfg.hidden_size = mc.hidden() == 0 ? 256 : mc.hidden();
    cfg.intermediate_size = mc.intermediate() != 0 ? mc.intermediate()
                                                   : (8 * cfg.hidden_size / 3 + 7) / 8 * 8;
    cfg.num_layers = mc.layers() == 0 ? 4 : mc.layers();
    cfg.num_heads = mc.heads() == 0 ? 4 : mc.heads();
    cfg.num_kv_heads = mc.kv_heads() == 0 ? cfg.num_heads : mc.kv_heads();
    cfg.head_dim = mc.head_dim();
    cfg.max_positions = mc.max_positions() == 0 ? 256 : mc.max_positions();
    cfg.rope_theta = mc.rope_theta() == 0 ? 10000.0 : mc.rope_theta();
    cfg.rms_norm_eps = mc.rms_norm_eps() == 0 ? 1e-6 : mc.rms_norm_eps();
    cfg.tie_embeddings = mc.tie_embeddings();
    cfg.bos_token_id = s.tokenizer->bos_id();
    cfg.eos_token_id = s.tokenizer->eos_id();
    cfg.pad_token_id = s.tokenizer->pad_id();
    cfg.value_head = reward_model;
    RLMESH_RETURN_IF_ERROR(Prefix("experiment.model", cfg.Validate()));
    RLMESH_RETURN_IF_ERROR(CatchAll("build policy", [&]() -> absl::Status {
      std::lock_guard<std::mutex> lock(InitMutex());
      torch::manual_seed(exp.seed());
      s.policy = actor::Transformer(cfg);
      s.policy->to(torch::Device(device));
      return absl::OkStatus();
    }));
  }
  if (cfg.vocab_size < s.tokenizer->vocab_size()) {
    return absl::InvalidArgumentError("experiment.model.tokenizer: vocabulary larger than the model's");
  }
  // Pairs given as token ids must fit the model.
  for (size_t i = 0; i < s.pairs.size(); ++i) {
    const PreferencePair& p = s.pairs[i];
    for (const auto* ids : {&p.prompt_ids, &p.chosen_ids, &p.rejected_ids}) {
      for (int id : *ids) {
        if (id >= cfg.vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat(sp, ".", s.kind, ".pairs_path: pair ", i, " has token id ",
                                                         id, ", outside the model's vocabulary of ", cfg.vocab_size));
        }
      }
    }
  }

  RLMESH_RETURN_IF_ERROR(CatchAll("build reference/critic", [&]() -> absl::Status {
    torch::NoGradGuard no_grad;
    auto copy_from_policy = [&](actor::Transformer& dst) {
      std::map<std::string, at::Tensor> src;
      for (auto& [name, t] : s.policy->NamedParameters()) src[name] = t;
      for (auto& [name, t] : dst->NamedParameters()) {
        auto it = src.find(name);
        if (it != src.end()) t.copy_(it->second);
      }
    };
    std::lock_guard<std::mutex> lock(InitMutex());
    if ((rl != nullptr && s.kl_coef > 0) || s.kind == "dpo") {
      // The frozen reference is the stage's initial policy.
      s.reference = actor::Transformer(cfg);
      s.reference->to(torch::Device(device));
      copy_from_policy(s.reference);
      for (auto& p : s.reference->parameters()) p.set_requires_grad(false);
      s.reference->eval();
    }
    if (s.kind == "ppo") {
      actor::ModelConfig ccfg = cfg;
      ccfg.value_head = true;
      torch::manual_seed(Mix(exp.seed(), 0xc417));
      s.critic = actor::Transformer(ccfg);
      s.critic->to(torch::Device(device));
      copy_from_policy(s.critic);
    }
    return absl::OkStatus();
  }));

  // The process group and the optimizers.
  if (s.world > 1) {
    const std::string& addr = req.store_address();
    if (absl::StartsWith(addr, "file:")) {
      auto store = dist::MakeFileStore(addr.substr(5), s.world);
      if (!store.ok()) return Prefix("store_address", store.status());
      s.store = *store;
    } else {
      const size_t colon = addr.rfind(':');
      int port = 0;
      if (colon == std::string::npos || !absl::SimpleAtoi(addr.substr(colon + 1), &port) || port <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("store_address: \"", addr, "\" is not file:/path or host:port"));
      }
      auto store = dist::MakeTcpStore(addr.substr(0, colon), port, s.rank == 0, s.world,
                                options_.store_timeout_ms);
      if (!store.ok()) return Prefix("store_address", store.status());
      s.store = *store;
    }
    auto group = dist::CreateGlooGroup(s.store, s.rank, s.world, options_.gloo);
    if (!group.ok()) return group.status();
    s.group = *group;
  }
  auto make_dp = [&](actor::Transformer& model, const Optim& o,
                     bool skip_lm_head) -> absl::StatusOr<std::unique_ptr<DataParallel>> {
    std::vector<at::Tensor> params;
    for (auto& [name, t] : model->NamedParameters()) {
      if (skip_lm_head && name == "lm_head.weight") continue;
      params.push_back(t);
    }
    DataParallelOptions dpo;
    dpo.zero1 = s.zero1;
    dpo.adamw = o.adamw;
    dpo.grad_clip = std::max(0.0, o.grad_clip);
    return DataParallel::Create(s.group, std::move(params), dpo);
  };
  // A reward model never uses its lm_head; keep it out of the optimizer.
  RLMESH_ASSIGN_OR_RETURN(s.dp, make_dp(s.policy, s.optim, reward_model));
  RLMESH_RETURN_IF_ERROR(s.dp->BroadcastParameters());
  if (s.critic) {
    // The critic's lm_head is never used; keep it out of the optimizer.
    RLMESH_ASSIGN_OR_RETURN(s.critic_dp, make_dp(s.critic, s.critic_optim, true));
    RLMESH_RETURN_IF_ERROR(s.critic_dp->BroadcastParameters());
  }
  if (s.reference) {
    // Every rank's reference equals its (broadcast) initial policy.
    RLMESH_RETURN_IF_ERROR(CatchAll("reference", [&]() -> absl::Status {
      torch::NoGradGuard no_grad;
      auto src = s.policy->NamedParameters();
      auto dst = s.reference->NamedParameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
      return absl::OkStatus();
    }));
  }

  s_ = std::move(st);
  const int64_t start_version = version_;
  // Resume from this stage's newest valid checkpoint, if any.
  if (!req.checkpoint_dir().empty()) {
    std::vector<std::string> refused;
    auto found = NewestValidCheckpoint(req.checkpoint_dir(), req.stage_index(), &refused);
    for (const std::string& r : refused) RLMESH_LOG(WARNING) << "refused checkpoint " << r;
    if (found.ok()) {
      absl::Status loaded = LoadFrom(found->path);
      if (!loaded.ok()) {
        s_.reset();
        step_ = 0;
        version_ = 0;
        PublishStatus();
        return loaded;
      }
      RLMESH_LOG(INFO) << "resumed path=" << found->path << " step=" << step_ << " version=" << version_;
    }
  }
  (void)start_version;
  PublishStatus();
  RLMESH_LOG(INFO) << "configured stage=" << s_->stage_name << " rank=" << s_->rank
                   << " world_size=" << s_->world << " step=" << step_ << " version=" << version_;
  ConfigureResponse resp;
  resp.set_policy_version(version_);
  resp.set_step(step_);
  return resp;
}

absl::StatusOr<TrainStepResponse> Trainer::TrainStep(const TrainStepRequest& req) {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  if (req.step() != step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("step: expected ", step_, " (the next step), got ", req.step()));
  }
  if (s_->kind == "sft") {
    if (req.data_case() != TrainStepRequest::kFromTask || !req.from_task()) {
      return absl::InvalidArgumentError("data: an SFT stage trains with from_task = true");
    }
    return TrainSft();
  }
  if (s_->kind == "reward_model" || s_->kind == "dpo") {
    if (req.data_case() != TrainStepRequest::kFromTask || !req.from_task()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data: a ", s_->kind, " stage trains with from_task = true (pairs from the stage)"));
    }
    return TrainPairs();
  }
  if (req.data_case() == TrainStepRequest::kGroups) {
    const int64_t G = req.groups().groups_size();
    if (G < s_->world) {
      return absl::InvalidArgumentError(
          absl::StrCat("groups: ", G, " groups for ", s_->world, " shards"));
    }
    std::vector<TrajectoryGroup> all(req.groups().groups().begin(), req.groups().groups().end());
    return TrainRl(RankSlice(std::move(all), s_->rank, s_->world), 0.0);
  }
  if (req.data_case() == TrainStepRequest::kBuffer) {
    const BufferSource& src = req.buffer();
    if (src.num_groups() <= 0 || src.num_groups() % s_->world != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buffer.num_groups: must be a positive multiple of the world size (", s_->world, ")"));
    }
    if (src.experiment_id().empty()) return absl::InvalidArgumentError("buffer.experiment_id: required");
    if (source_ == nullptr) {
      return absl::FailedPreconditionError("no replay buffer (Configure with replay_buffer_address)");
    }
    if (!src.mode().empty() && src.mode() != "fifo" && src.mode() != "uniform" && src.mode() != "prioritized") {
      return absl::InvalidArgumentError(
          absl::StrCat("buffer.mode: \"", src.mode(), "\" is not fifo, uniform or prioritized"));
    }
    // Every shard draws the whole global batch (FIFO through a cursor of its
    // own), orders it by group id and trains on its slice. The batch, its
    // order and the split over shards then depend only on what is in the
    // buffer, not on which worker's groups landed first or which shard asked
    // first: the same run gives the same gradients (docs/decisions.md).
    BufferSource mine = src;
    if (s_->world > 1) mine.set_consumer_id(absl::StrCat(src.consumer_id(), "/r", s_->rank));
    const auto t0 = Clock::now();
    auto sampled = source_->Sample(mine, src.num_groups(), options_.sample_timeout);
    if (!sampled.ok()) return sampled.status();
    if (static_cast<int>(sampled->groups.size()) != src.num_groups()) {
      return absl::DataLossError(absl::StrCat("replay buffer returned ", sampled->groups.size(), " groups for ",
                                              src.num_groups()));
    }
    std::vector<TrajectoryGroup>& all = sampled->groups;
    std::stable_sort(all.begin(), all.end(), [](const TrajectoryGroup& a, const TrajectoryGroup& b) {
      return a.group_id() < b.group_id();
    });
    auto resp = TrainRl(RankSlice(std::move(all), s_->rank, s_->world), Since(t0));
    if (!resp.ok()) return resp;
    if (!sampled->ack_token.empty()) {
      absl::Status acked = source_->Ack(mine, sampled->ack_token);
      // The step is applied; a lost ack only means redelivery later.
      if (!acked.ok()) RLMESH_LOG(WARNING) << "ack failed step=" << req.step() << ": " << acked;
    }
    return resp;
  }
  return absl::InvalidArgumentError("data: an RL stage trains on buffer or groups");
}

absl::StatusOr<TrainStepResponse> Trainer::TrainSft() {
  State& s = *s_;
  const auto t_start = Clock::now();
  // Every rank draws the same global batch and takes its slice.
  std::vector<const Example*> global = s.loader->Next(s.sft_batch);
  const int64_t lo = s.rank * s.sft_batch / s.world, hi = (s.rank + 1) * s.sft_batch / s.world;
  const int64_t max_len = s.policy->config().max_positions;
  std::vector<Seq> seqs;
  for (int64_t i = lo; i < hi; ++i) {
    std::vector<int> p = EncodePrompt(*s.tokenizer, global[i]->prompt);
    const Example& e = *global[i];
    std::vector<int> r = EncodeResponse(*s.tokenizer, e.sft_target.empty() ? e.answer : e.sft_target);
    Seq q;
    q.ids.assign(p.begin(), p.end());
    q.ids.insert(q.ids.end(), r.begin(), r.end());
    if (static_cast<int64_t>(q.ids.size()) > max_len) q.ids.resize(max_len);
    const int64_t L = q.ids.size();
    q.mask.assign(L, 0.0f);
    const int64_t first = s.train_on_prompt ? 0 : static_cast<int64_t>(p.size()) - 1;
    for (int64_t t = std::max<int64_t>(0, first); t + 1 < L; ++t) q.mask[t] = 1.0f;
    seqs.push_back(std::move(q));
  }
  TrainStepResponse resp;
  auto& m = *resp.mutable_metrics()->mutable_values();
  double fb_seconds = 0, opt_seconds = 0;
  absl::Status st = CatchAll("sft step", [&]() -> absl::Status {
    std::vector<int64_t> lengths;
    Batch b;
    if (s.packing) {
      b = MakePackedBatch(seqs, max_len, &lengths);
    } else {
      b = MakeBatch(seqs, false);
      for (const Seq& q : seqs) lengths.push_back(q.ids.size());
    }
    const double local_tokens = seqs.empty() ? 0.0 : b.mask.sum().item<double>();
    s.dp->ZeroGrad();
    MetricMeans means;
    const auto t0 = Clock::now();
    for (auto [a, e] : MicroBatches(lengths, 0, static_cast<int64_t>(lengths.size()), s.micro_tokens)) {
      const int64_t T = *std::max_element(lengths.begin() + a, lengths.begin() + e);
      at::Tensor mask = Rows(b.mask, a, e, T);
      const double w = mask.sum().item<double>();
      if (w == 0) continue;
      RLMESH_ASSIGN_OR_RETURN(auto lp, s.LogProbs(s.policy, Rows(b.input_ids, a, e, T),
                                                  Rows(b.positions, a, e, T), Rows(b.targets, a, e, T),
                                                  options_.logprob_chunk, 1.0,
                                                  b.segments.defined() ? Rows(b.segments, a, e, T) : at::Tensor()));
      RLMESH_ASSIGN_OR_RETURN(LossOutput out, SftLoss(lp.logprobs, mask, LossAgg::kTokenMean));
      (out.loss * (w / local_tokens)).backward();
      means.Add(out.metrics, w);
    }
    fb_seconds = Since(t0);
    const auto t1 = Clock::now();
    const double lr = LearningRate(s.optim.schedule, s.dp->steps());
    RLMESH_ASSIGN_OR_RETURN(DataParallelStepStats stats, s.dp->Step(local_tokens, lr));
    opt_seconds = Since(t1);
    std::map<std::string, double> vals;
    means.Into(&vals);
    for (auto& [k, v] : vals) m[k] = v;
    m["loss"] = vals.count("sft_loss") ? vals["sft_loss"] : 0.0;
    m["grad_norm"] = stats.grad_norm;
    m["lr"] = lr;
    m["skipped"] = stats.skipped ? 1.0 : 0.0;
    m["tokens"] = static_cast<double>(b.tokens);
    m["rows"] = static_cast<double>(lengths.size());
    m["loss_tokens"] = local_tokens;
    m["seconds_allreduce"] = stats.reduce_seconds + stats.gather_seconds;
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  m["seconds_forward_backward"] = fb_seconds;
  m["seconds_optimizer"] = opt_seconds;
  m["seconds_sample"] = 0.0;
  const double total = Since(t_start);
  m["tokens_per_second"] = total > 0 ? m["tokens"] / total : 0.0;
  ++step_;
  ++version_;
  resp.set_policy_version(version_);
  PublishStatus();
  return resp;
}

absl::StatusOr<TrainStepResponse> Trainer::TrainRl(std::vector<TrajectoryGroup> groups,
                                                   double seconds_sample) {
  State& s = *s_;
  const auto t_start = Clock::now();
  const int64_t vocab = s.policy->config().vocab_size;
  const int64_t max_len = s.policy->config().max_positions;

  // Validate and tokenise; rewards per group (with overlong shaping).
  struct Row {
    Seq seq;
    int64_t group = 0;
    double reward = 0;
    int64_t response_len = 0;
  };
  std::vector<Row> rows;
  std::vector<std::vector<double>> group_rewards;
  double raw_sum = 0, raw_sq = 0, len_sum = 0;
  int64_t raw_n = 0, zero_var = 0, kept_groups = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const TrajectoryGroup& grp = groups[g];
    const std::string gp = absl::StrCat("groups[", g, "]");
    if (grp.samples_size() == 0) return absl::InvalidArgumentError(gp + ".samples: empty");
    std::vector<double> rewards;
    std::vector<Row> grows;
    for (int i = 0; i < grp.samples_size(); ++i) {
      const Trajectory& t = grp.samples(i);
      const std::string tp = absl::StrCat(gp, ".samples[", i, "]");
      const int P = t.prompt_token_ids_size(), R = t.response_token_ids_size();
      if (P == 0) return absl::InvalidArgumentError(tp + ".prompt_token_ids: empty");
      if (R == 0) return absl::InvalidArgumentError(tp + ".response_token_ids: empty");
      if (P + R > max_len) {
        return absl::InvalidArgumentError(absl::StrCat(tp, ": ", P + R,
                                                       " tokens exceed the model's max_positions ", max_len));
      }
      if (t.loss_mask_size() != 0 && t.loss_mask_size() != R) {
        return absl::InvalidArgumentError(tp + ".loss_mask: length differs from response_token_ids");
      }
      if (t.behaviour_logprobs_size() != 0 && t.behaviour_logprobs_size() != R) {
        return absl::InvalidArgumentError(tp + ".behaviour_logprobs: length differs from response_token_ids");
      }
      if (!std::isfinite(t.reward())) return absl::InvalidArgumentError(tp + ".reward: not finite");
      Row row;
      row.seq.ids.reserve(P + R);
      for (int id : t.prompt_token_ids()) row.seq.ids.push_back(id);
      for (int id : t.response_token_ids()) row.seq.ids.push_back(id);
      for (int64_t id : row.seq.ids) {
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat(tp, ": token id ", id, " outside the vocabulary"));
        }
      }
      const int64_t L = P + R;
      row.seq.mask.assign(L, 0.0f);
      row.seq.behaviour.assign(L, 0.0f);
      for (int j = 0; j < R; ++j) {
        row.seq.mask[P + j - 1] = t.loss_mask_size() == 0 ? 1.0f : (t.loss_mask(j) != 0 ? 1.0f : 0.0f);
        if (t.behaviour_logprobs_size() != 0) row.seq.behaviour[P + j - 1] = t.behaviour_logprobs(j);
      }
      row.reward = t.reward();
      row.response_len = R;
      raw_sum += t.reward();
      raw_sq += t.reward() * t.reward();
      len_sum += R;
      ++raw_n;
      rewards.push_back(t.reward());
      grows.push_back(std::move(row));
    }
    const auto [mn, mx] = std::minmax_element(rewards.begin(), rewards.end());
    const bool zero_variance = *mx - *mn <= 0.0;
    if (zero_variance) ++zero_var;
    if (zero_variance && s.drop_zero_variance) continue;
    for (Row& r : grows) {
      r.group = kept_groups;
      rows.push_back(std::move(r));
    }
    group_rewards.push_back(std::move(rewards));
    ++kept_groups;
  }
  // A group's advantages need all its samples, so behaviour log-probs must
  // be all present or all absent in the batch.
  bool with_behaviour = false;
  for (const auto& g : groups) {
    for (const auto& t : g.samples()) with_behaviour |= t.behaviour_logprobs_size() > 0;
  }

  TrainStepResponse resp;
  auto& m = *resp.mutable_metrics()->mutable_values();
  m["reward_mean"] = raw_n ? raw_sum / raw_n : 0.0;
  m["reward_std"] = raw_n ? std::sqrt(std::max(0.0, raw_sq / raw_n - std::pow(raw_sum / raw_n, 2))) : 0.0;
  m["response_length_mean"] = raw_n ? len_sum / raw_n : 0.0;
  m["zero_variance_frac"] = groups.empty() ? 0.0 : static_cast<double>(zero_var) / groups.size();
  m["groups"] = static_cast<double>(kept_groups);
  m["seconds_sample"] = seconds_sample;
  double fb_seconds = 0, opt_seconds = 0;

  absl::Status st = CatchAll("rl step", [&]() -> absl::Status {
    const int64_t B = rows.size();
    std::vector<Seq> seqs;
    std::vector<int64_t> lengths;
    for (const Row& r : rows) {
      seqs.push_back(r.seq);
      lengths.push_back(r.seq.ids.size());
    }
    Batch b = MakeBatch(seqs, with_behaviour);
    const int64_t T_all = b.input_ids.size(1);
    m["tokens"] = static_cast<double>(b.tokens);

    // Partition: mini-batches of rows, micro-batches inside them. The same
    // micro-batches serve the no-grad pass and the first training pass, so
    // on-policy ratios are exactly 1.
    std::vector<std::vector<std::pair<int64_t, int64_t>>> minis;
    for (int k = 0; k < s.mini_batches; ++k) {
      const int64_t a = k * B / s.mini_batches, e = (k + 1) * B / s.mini_batches;
      minis.push_back(MicroBatches(lengths, a, e, s.micro_tokens));
    }
    auto longest = [&](int64_t a, int64_t e) {
      return *std::max_element(lengths.begin() + a, lengths.begin() + e);
    };

    // Old log-probs (and reference log-probs, old values) without grad.
    const auto t0 = Clock::now();
    at::Tensor old_logp = at::zeros({B, T_all}, at::kFloat);
    at::Tensor ref_logp, old_values;
    if (s.reference) ref_logp = at::zeros({B, T_all}, at::kFloat);
    if (s.critic) old_values = at::zeros({B, T_all}, at::kFloat);
    {
      torch::NoGradGuard no_grad;
      for (const auto& micro : minis) {
        for (auto [a, e] : micro) {
          const int64_t T = longest(a, e);
          auto ids = Rows(b.input_ids, a, e, T), pos = Rows(b.positions, a, e, T),
               tg = Rows(b.targets, a, e, T);
          RLMESH_ASSIGN_OR_RETURN(auto lp, s.LogProbs(s.policy, ids, pos, tg,
                                                                options_.logprob_chunk, s.temperature));
          Rows(old_logp, a, e, T).copy_(lp.logprobs);
          if (s.reference) {
            RLMESH_ASSIGN_OR_RETURN(auto rlp, s.LogProbs(s.reference, ids, pos, tg,
                                                                   options_.logprob_chunk, s.temperature));
            Rows(ref_logp, a, e, T).copy_(rlp.logprobs);
          }
          if (s.critic) Rows(old_values, a, e, T).copy_(s.Values(s.critic, ids, pos));
        }
      }
    }
    at::Tensor mask = b.mask;
    if (with_behaviour) {
      const double diff =
          B ? ((old_logp - b.behaviour).abs() * mask).max().item<double>() : 0.0;
      m["behaviour_logp_abs_diff_max"] = diff;
    }

    // Per-token KL for rewards (KL in the reward).
    at::Tensor kl_tokens;
    if (s.reference && s.kl_in_reward) {
      RLMESH_ASSIGN_OR_RETURN(kl_tokens, KlPenalty(old_logp, ref_logp, s.kl_estimator));
      kl_tokens = kl_tokens * mask;
    }

    // Rewards with DAPO overlong shaping.
    at::Tensor rewards = at::zeros({B}, at::kDouble);
    for (int64_t r = 0; r < B; ++r) rewards[r] = rows[r].reward;
    if (s.overlong_buffer > 0 && B > 0) {
      at::Tensor lens = at::zeros({B}, at::kLong);
      for (int64_t r = 0; r < B; ++r) lens[r] = rows[r].response_len;
      RLMESH_ASSIGN_OR_RETURN(at::Tensor pen, OverlongPenalty(lens, s.max_new_tokens, s.overlong_buffer,
                                                              s.overlong_penalty));
      rewards = rewards + pen.to(at::kDouble);
      m["overlong_penalty_mean"] = pen.mean().item<double>();
    }
    rewards = rewards.to(at::kFloat);

    // Advantages [B, T_all].
    const GlobalSum global_sum = [&](at::Tensor& t) { return s.dp->AllReduceSum(t); };
    at::Tensor adv, returns;
    if (B == 0) {
      adv = at::zeros({0, T_all}, at::kFloat);
      if (s.world > 1 && (s.advantage == "reinforce_pp" || (s.advantage == "ppo" && s.gae.whiten))) {
        // The other ranks whiten over the global batch: take part in the
        // same two sums with nothing, and fail as they do when it is empty.
        at::Tensor first = at::zeros({2}, at::kDouble), second = at::zeros({1}, at::kDouble);
        RLMESH_RETURN_IF_ERROR(global_sum(first));
        if (first[1].item<double>() < 2) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mask: whitening needs at least 2 masked tokens, got ", first[1].item<double>()));
        }
        RLMESH_RETURN_IF_ERROR(global_sum(second));
      }
    } else if (s.advantage == "grpo" || s.advantage == "dr_grpo" || s.advantage == "rloo") {
      at::Tensor seq_r = rewards.clone();
      if (kl_tokens.defined()) seq_r = seq_r - s.kl_coef * kl_tokens.sum(1);
      at::Tensor seq_adv = at::zeros({B}, at::kFloat);
      int64_t r0 = 0;
      for (size_t g = 0; g < group_rewards.size(); ++g) {
        const int64_t n = group_rewards[g].size();
        at::Tensor gr = seq_r.narrow(0, r0, n).unsqueeze(0);
        absl::StatusOr<at::Tensor> a;
        if (n == 1) {
          a = at::zeros({1, 1}, at::kFloat);  // no baseline from one sample
        } else if (s.advantage == "rloo") {
          a = RlooAdvantages(gr);
        } else {
          a = GrpoAdvantages(gr, s.advantage == "grpo");
        }
        if (!a.ok()) return a.status();
        seq_adv.narrow(0, r0, n).copy_(a->reshape({n}));
        r0 += n;
      }
      RLMESH_ASSIGN_OR_RETURN(adv, ExpandToTokens(seq_adv, mask));
    } else if (s.advantage == "reinforce_pp") {
      // Whitened over the global batch: every rank's tokens, not its slice.
      RLMESH_ASSIGN_OR_RETURN(adv, ReinforcePlusPlusAdvantages(rewards, mask, kl_tokens,
                                                               kl_tokens.defined() ? s.kl_coef : 0.0,
                                                               /*gamma=*/1.0, global_sum));
    } else {  // ppo
      GaeOptions gae = s.gae;
      gae.kl_coef = kl_tokens.defined() ? s.kl_coef : 0.0;
      gae.global_sum = global_sum;
      RLMESH_ASSIGN_OR_RETURN(GaeResult res, GaeAdvantages(rewards, old_values, mask, gae, kl_tokens));
      adv = res.advantages;
      returns = res.returns;
    }

    // Loss weights: what the aggregation averages over.
    auto weight_of = [&](const at::Tensor& mk) -> double {
      switch (s.loss.agg) {
        case LossAgg::kTokenMean:
          return mk.sum().item<double>();
        case LossAgg::kSeqMeanTokenMean:
          return mk.sum(1).gt(0).sum().item<double>();
        default:
          return static_cast<double>(mk.size(0));
      }
    };

    MetricMeans means;
    double grad_norm_sum = 0, value_grad_norm_sum = 0, lr = 0;
    int64_t opt_steps = 0, skipped = 0;
    fb_seconds += Since(t0);
    for (int epoch = 0; epoch < s.epochs; ++epoch) {
      for (const auto& micro : minis) {
        const auto t1 = Clock::now();
        s.dp->ZeroGrad();
        if (s.critic_dp) s.critic_dp->ZeroGrad();
        double mini_w = 0;
        for (auto [a, e] : micro) mini_w += weight_of(Rows(mask, a, e, longest(a, e)));
        for (auto [a, e] : micro) {
          const int64_t T = longest(a, e);
          at::Tensor mk = Rows(mask, a, e, T);
          const double w = weight_of(mk);
          if (w == 0) continue;
          auto ids = Rows(b.input_ids, a, e, T), pos = Rows(b.positions, a, e, T),
               tg = Rows(b.targets, a, e, T);
          RLMESH_ASSIGN_OR_RETURN(auto lp, s.LogProbs(s.policy, ids, pos, tg,
                                                                options_.logprob_chunk, s.temperature));
          PolicyLossInputs in;
          in.logp = lp.logprobs;
          in.old_logp = Rows(old_logp, a, e, T);
          in.advantages = Rows(adv, a, e, T);
          in.mask = mk;
          if (with_behaviour) in.behaviour_logp = Rows(b.behaviour, a, e, T);
          if (s.reference) in.ref_logp = Rows(ref_logp, a, e, T);
          in.entropy = s.loss.entropy_coef > 0 ? lp.entropy : lp.entropy.detach();
          RLMESH_ASSIGN_OR_RETURN(LossOutput out, PolicyLoss(in, s.loss));
          at::Tensor total = out.loss * (w / mini_w);
          if (s.critic) {
            at::Tensor values = s.Values(s.critic, ids, pos);
            RLMESH_ASSIGN_OR_RETURN(LossOutput vo, ValueLoss(values, Rows(old_values, a, e, T),
                                                             Rows(returns, a, e, T), mk, s.value_clip,
                                                             s.loss.agg));
            total = total + s.vf_coef * vo.loss * (w / mini_w);
            out.metrics["value_loss"] = vo.metrics["vf_loss"];
            out.metrics["value_mean"] = vo.metrics["value_mean"];
            out.metrics["value_clip_frac"] = vo.metrics["vf_clip_frac"];
            out.metrics["return_mean"] = vo.metrics["return_mean"];
          }
          total.backward();
          means.Add(out.metrics, w);
        }
        fb_seconds += Since(t1);
        const auto t2 = Clock::now();
        lr = LearningRate(s.optim.schedule, s.dp->steps());
        auto stats = s.dp->Step(mini_w, lr);
        if (!stats.ok() && mini_w == 0 && stats.status().code() == absl::StatusCode::kInvalidArgument) {
          // Nothing to learn from on any rank (e.g. every group dropped as
          // zero-variance): the global weight is 0 and no update happens.
          ++skipped;
          opt_seconds += Since(t2);
          continue;
        }
        if (!stats.ok()) return stats.status();
        grad_norm_sum += stats->grad_norm;
        skipped += stats->skipped ? 1 : 0;
        if (s.critic_dp) {
          const double clr = LearningRate(s.critic_optim.schedule, s.critic_dp->steps());
          auto cst = s.critic_dp->Step(mini_w, clr);
          if (!cst.ok()) return cst.status();
          value_grad_norm_sum += cst->grad_norm;
        }
        ++opt_steps;
        opt_seconds += Since(t2);
      }
    }
    std::map<std::string, double> vals;
    means.Into(&vals);
    for (auto& [k, v] : vals) m[k] = v;
    // Stable names present on every step (0 when the term is off).
    for (const char* k : {"loss", "pg_loss", "kl", "entropy", "clip_frac", "ratio_mean"}) {
      if (!m.count(k)) m[k] = 0.0;
    }
    m["grad_norm"] = opt_steps ? grad_norm_sum / opt_steps : 0.0;
    if (s.critic_dp) m["value_grad_norm"] = opt_steps ? value_grad_norm_sum / opt_steps : 0.0;
    m["lr"] = lr;
    m["optimizer_steps"] = static_cast<double>(opt_steps);
    m["skipped"] = static_cast<double>(skipped);
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  m["seconds_forward_backward"] = fb_seconds;
  m["seconds_optimizer"] = opt_seconds;
  const double total = Since(t_start);
  m["tokens_per_second"] = total > 0 ? m["tokens"] * s.epochs / total : 0.0;
  ++step_;
  ++version_;
  resp.set_policy_version(version_);
  PublishStatus();
  return resp;
}

absl::Status Trainer::PairPass(const std::vector<const PreferencePair*>& pairs, bool train,
                               std::map<std::string, double>* metrics) {
  State& s = *s_;
  const bool rm = s.kind == "reward_model";
  const int64_t max_len = s.policy->config().max_positions;
  // Rows 2i (chosen) and 2i+1 (rejected): prompt + response, truncated to
  // the context window; the mask marks the response's predicted tokens.
  std::vector<Seq> seqs;
  std::vector<int64_t> pair_lengths;
  for (const PreferencePair* pp : pairs) {
    const std::vector<int> p = pp->has_ids() ? pp->prompt_ids : EncodePrompt(*s.tokenizer, pp->prompt);
    int64_t longest = 0;
    for (int side = 0; side < 2; ++side) {
      const std::vector<int> r = pp->has_ids() ? (side == 0 ? pp->chosen_ids : pp->rejected_ids)
                                               : EncodeResponse(*s.tokenizer, side == 0 ? pp->chosen : pp->rejected);
      Seq q;
      q.ids.assign(p.begin(), p.end());
      q.ids.insert(q.ids.end(), r.begin(), r.end());
      if (static_cast<int64_t>(q.ids.size()) > max_len) q.ids.resize(max_len);
      const int64_t L = q.ids.size();
      q.mask.assign(L, 0.0f);
      for (int64_t t = std::max<int64_t>(0, static_cast<int64_t>(p.size()) - 1); t + 1 < L; ++t) q.mask[t] = 1.0f;
      longest = std::max(longest, L);
      seqs.push_back(std::move(q));
    }
    pair_lengths.push_back(longest);
  }
  const int64_t n = pairs.size();
  if (n == 0) return absl::OkStatus();
  return CatchAll("pair step", [&]() -> absl::Status {
    Batch b = MakeBatch(seqs, false);
    std::vector<int64_t> row_lengths;
    for (const Seq& q : seqs) row_lengths.push_back(q.ids.size());
    MetricMeans means;
    // Each micro-batch holds whole pairs (2 rows per pair).
    for (auto [a, e] : MicroBatches(pair_lengths, 0, n, std::max<int64_t>(1, s.micro_tokens / 2))) {
      const int64_t ra = 2 * a, re = 2 * e;
      const int64_t T = *std::max_element(row_lengths.begin() + ra, row_lengths.begin() + re);
      auto ids = Rows(b.input_ids, ra, re, T), pos = Rows(b.positions, ra, re, T);
      std::unique_ptr<torch::NoGradGuard> no_grad;
      if (!train) no_grad = std::make_unique<torch::NoGradGuard>();
      LossOutput out;
      if (rm) {
        // Score = the value at the last real token (eos) of prompt+response.
        at::Tensor last = at::zeros({re - ra, 1}, at::kLong);
        for (int64_t r = ra; r < re; ++r) last[r - ra][0] = row_lengths[r] - 1;
        at::Tensor scores = s.Values(s.policy, ids, pos).gather(1, last).squeeze(1);
        at::Tensor pair_scores = scores.view({e - a, 2});
        RLMESH_ASSIGN_OR_RETURN(out, RewardModelLoss(pair_scores.select(1, 0), pair_scores.select(1, 1)));
        out.metrics["loss"] = out.metrics["rm_loss"];
        out.metrics["margin"] = out.metrics["rm_margin"];
      } else {
        auto tg = Rows(b.targets, ra, re, T);
        at::Tensor mask = Rows(b.mask, ra, re, T);
        at::Tensor ref_seq;
        {
          torch::NoGradGuard ref_no_grad;
          RLMESH_ASSIGN_OR_RETURN(auto rlp, s.LogProbs(s.reference, ids, pos, tg,
                                                                 options_.logprob_chunk, 1.0));
          RLMESH_ASSIGN_OR_RETURN(ref_seq, SequenceLogProbs(rlp.logprobs, mask));
        }
        RLMESH_ASSIGN_OR_RETURN(auto lp, s.LogProbs(s.policy, ids, pos, tg, options_.logprob_chunk, 1.0));
        RLMESH_ASSIGN_OR_RETURN(at::Tensor pol_seq, SequenceLogProbs(lp.logprobs, mask));
        at::Tensor pol = pol_seq.view({e - a, 2}), ref = ref_seq.view({e - a, 2});
        DpoInputs in;
        in.policy_chosen_logp = pol.select(1, 0);
        in.policy_rejected_logp = pol.select(1, 1);
        in.ref_chosen_logp = ref.select(1, 0);
        in.ref_rejected_logp = ref.select(1, 1);
        RLMESH_ASSIGN_OR_RETURN(out, DpoLoss(in, s.beta));
        out.metrics["loss"] = out.metrics["dpo_loss"];
        out.metrics["dpo_accuracy"] = out.metrics["reward_accuracy"];
        out.metrics["chosen_reward"] = out.metrics["reward_chosen"];
        out.metrics["rejected_reward"] = out.metrics["reward_rejected"];
      }
      if (train) (out.loss * (static_cast<double>(e - a) / n)).backward();
      means.Add(out.metrics, static_cast<double>(e - a));
    }
    means.Into(metrics);
    (*metrics)["pairs"] = static_cast<double>(n);
    (*metrics)["tokens"] = static_cast<double>(b.tokens);
    return absl::OkStatus();
  });
}

absl::StatusOr<TrainStepResponse> Trainer::TrainPairs() {
  State& s = *s_;
  const auto t_start = Clock::now();
  // Every rank draws the same global batch of pairs and takes its slice.
  std::vector<const Example*> global = s.loader->Next(s.pair_batch);
  const int64_t lo = s.rank * s.pair_batch / s.world, hi = (s.rank + 1) * s.pair_batch / s.world;
  std::vector<const PreferencePair*> mine;
  for (int64_t i = lo; i < hi; ++i) mine.push_back(&s.pairs[global[i] - s.pair_keys.data()]);
  TrainStepResponse resp;
  auto& m = *resp.mutable_metrics()->mutable_values();
  std::map<std::string, double> vals;
  s.dp->ZeroGrad();
  const auto t0 = Clock::now();
  RLMESH_RETURN_IF_ERROR(PairPass(mine, /*train=*/true, &vals));
  const double fb_seconds = Since(t0);
  const auto t1 = Clock::now();
  const double lr = LearningRate(s.optim.schedule, s.dp->steps());
  absl::StatusOr<DataParallelStepStats> stats = CatchAll(
      "optimizer step", [&]() { return s.dp->Step(static_cast<double>(mine.size()), lr); });
  if (!stats.ok()) return stats.status();
  for (auto& [k, v] : vals) m[k] = v;
  m["grad_norm"] = stats->grad_norm;
  m["lr"] = lr;
  m["skipped"] = stats->skipped ? 1.0 : 0.0;
  m["seconds_allreduce"] = stats->reduce_seconds + stats->gather_seconds;
  m["seconds_forward_backward"] = fb_seconds;
  m["seconds_optimizer"] = Since(t1);
  m["seconds_sample"] = 0.0;
  const double total = Since(t_start);
  m["tokens_per_second"] = total > 0 ? m["tokens"] / total : 0.0;
  ++step_;
  // A reward model is not a policy: the policy version stays where the
  // stage started (rollout workers never load it).
  if (s.kind != "reward_model") ++version_;
  resp.set_policy_version(version_);
  PublishStatus();
  return resp;
}

absl::StatusOr<std::map<std::string, double>> Trainer::EvaluatePairs(const std::vector<PreferencePair>& pairs) {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  if (s_->kind != "reward_model" && s_->kind != "dpo") {
    return absl::FailedPreconditionError(
        absl::StrCat("EvaluatePairs: stage ", s_->stage_name, " is not a reward_model or dpo stage"));
  }
  if (pairs.empty()) return absl::InvalidArgumentError("pairs: empty");
  std::vector<const PreferencePair*> ptrs;
  for (const PreferencePair& p : pairs) ptrs.push_back(&p);
  std::map<std::string, double> metrics;
  RLMESH_RETURN_IF_ERROR(PairPass(ptrs, /*train=*/false, &metrics));
  return metrics;
}

absl::StatusOr<SaveResponse> Trainer::Save(const std::string& path) {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  State& s = *s_;
  std::string final_dir = path;
  if (final_dir.empty()) {
    if (s.request.checkpoint_dir().empty()) {
      return absl::FailedPreconditionError("path: empty and no checkpoint_dir was configured");
    }
    final_dir = absl::StrCat(s.request.checkpoint_dir(), "/", CheckpointName(step_));
  }
  while (final_dir.size() > 1 && final_dir.back() == '/') final_dir.pop_back();
  const fs::path fp(final_dir);
  const std::string parent = fp.parent_path().empty() ? "." : fp.parent_path().string();
  const std::string staging = absl::StrCat(parent, "/.tmp-", fp.filename().string());
  auto barrier = [&]() -> absl::Status {
    if (!s.group) return absl::OkStatus();
    return CatchAll("barrier", [&]() -> absl::Status {
      s.group->barrier()->wait();
      return absl::OkStatus();
    });
  };
  const std::string opt_file =
      s.zero1 ? absl::StrFormat("optimizer-rank-%d.safetensors", s.rank) : "optimizer.safetensors";

  absl::Status st = CatchAll("save", [&]() -> absl::Status {
    std::error_code ec;
    if (s.rank == 0) {
      fs::remove_all(staging, ec);
      fs::create_directories(staging, ec);
      if (ec) return absl::InternalError(absl::StrCat("create ", staging, ": ", ec.message()));
    }
    RLMESH_RETURN_IF_ERROR(barrier());
    if (s.rank == 0 || s.zero1) {
      std::vector<std::pair<std::string, at::Tensor>> t = {{"policy.exp_avg", s.dp->exp_avg()},
                                                           {"policy.exp_avg_sq", s.dp->exp_avg_sq()}};
      if (s.critic_dp) {
        t.emplace_back("critic.exp_avg", s.critic_dp->exp_avg());
        t.emplace_back("critic.exp_avg_sq", s.critic_dp->exp_avg_sq());
      }
      RLMESH_RETURN_IF_ERROR(actor::WriteSafetensors(absl::StrCat(staging, "/", opt_file), t));
    }
    if (s.rank == 0) {
      const actor::SaveOptions so{.tokenizer = s.tokenizer.get()};
      RLMESH_RETURN_IF_ERROR(actor::SaveHfModel(s.policy, staging, so));
      if (s.critic) RLMESH_RETURN_IF_ERROR(actor::SaveHfModel(s.critic, staging + "/critic", so));
    }
    RLMESH_RETURN_IF_ERROR(barrier());
    if (s.rank == 0) {
      TrainerState ts;
      ts.experiment = s.request.experiment().name();
      ts.stage_index = s.request.stage_index();
      ts.stage_kind = s.kind;
      ts.step = step_;
      ts.policy_version = version_;
      ts.seed = s.request.experiment().seed();
      if (s.loader) {
        ts.loader_epoch = s.loader->cursor().epoch;
        ts.loader_index = s.loader->cursor().index;
      }
      ts.optimizer_steps = s.dp->steps();
      ts.critic_optimizer_steps = s.critic_dp ? s.critic_dp->steps() : 0;
      ts.world_size = s.world;
      ts.zero1 = s.zero1;
      for (fs::recursive_directory_iterator it(staging), end; it != end; ++it) {
        if (!it->is_regular_file()) continue;
        const std::string rel = fs::relative(it->path(), staging).string();
        RLMESH_ASSIGN_OR_RETURN(ts.files[rel], DigestFile(it->path().string()));
      }
      RLMESH_RETURN_IF_ERROR(
          WriteFileAtomically(staging + "/trainer_state.json", TrainerStateToJson(ts)));
      RLMESH_RETURN_IF_ERROR(CommitCheckpoint(staging, final_dir));
      if (path.empty()) {
        const int keep = s.request.experiment().checkpoint().keep() == 0
                             ? 3
                             : s.request.experiment().checkpoint().keep();
        RLMESH_RETURN_IF_ERROR(PruneCheckpoints(s.request.checkpoint_dir(), keep));
      }
    }
    return barrier();
  });
  if (!st.ok()) return st;
  RLMESH_LOG(INFO) << "saved path=" << final_dir << " step=" << step_ << " version=" << version_;
  if (s.kind == "reward_model" && !s.rm_output.empty() && step_ >= s.stage_steps && s.rank == 0) {
    // The trained reward model, as a plain HF folder (config says
    // ForSequenceClassification; score.weight is the head).
    absl::Status out = CatchAll("save reward model", [&]() -> absl::Status {
      std::error_code ec;
      fs::create_directories(s.rm_output, ec);
      if (ec) return absl::InternalError(absl::StrCat("create ", s.rm_output, ": ", ec.message()));
      return actor::SaveHfModel(s.policy, s.rm_output, {.tokenizer = s.tokenizer.get()});
    });
    if (!out.ok()) return Prefix(absl::StrCat("experiment.stages[", s.request.stage_index(), "].reward_model.output"), out);
    RLMESH_LOG(INFO) << "reward model written path=" << s.rm_output;
  }
  SaveResponse resp;
  resp.set_path(final_dir);
  resp.set_step(step_);
  resp.set_policy_version(version_);
  return resp;
}

absl::StatusOr<LoadResponse> Trainer::Load(const std::string& path) {
  if (!s_) return absl::FailedPreconditionError("learner is not configured (call Configure first)");
  std::string dir = path;
  if (dir.empty()) {
    if (s_->request.checkpoint_dir().empty()) {
      return absl::FailedPreconditionError("path: empty and no checkpoint_dir was configured");
    }
    std::vector<std::string> refused;
    auto found = NewestValidCheckpoint(s_->request.checkpoint_dir(), s_->request.stage_index(), &refused);
    for (const std::string& r : refused) RLMESH_LOG(WARNING) << "refused checkpoint " << r;
    if (!found.ok()) {
      std::string why;
      for (const std::string& r : refused) absl::StrAppend(&why, "; refused ", r);
      return absl::NotFoundError(absl::StrCat(found.status().message(), why));
    }
    dir = found->path;
  }
  RLMESH_RETURN_IF_ERROR(LoadFrom(dir));
  PublishStatus();
  LoadResponse resp;
  resp.set_path(dir);
  resp.set_step(step_);
  resp.set_policy_version(version_);
  return resp;
}

absl::Status Trainer::LoadFrom(const std::string& dir) {
  State& s = *s_;
  RLMESH_ASSIGN_OR_RETURN(TrainerState ts, VerifyCheckpoint(dir));
  if (ts.stage_index != s.request.stage_index() || ts.stage_kind != s.kind) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": checkpoint of stage ", ts.stage_index, " (", ts.stage_kind, "), configured stage is ",
        s.request.stage_index(), " (", s.kind, ")"));
  }
  if (ts.zero1 != s.zero1 || (s.zero1 && ts.world_size != s.world)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, ": optimizer state written with world_size ",
                                                      ts.world_size, " zero1=", ts.zero1,
                                                      "; resume with the same sharding"));
  }
  const std::string opt_file = absl::StrCat(
      dir, "/", s.zero1 ? absl::StrFormat("optimizer-rank-%d.safetensors", s.rank) : "optimizer.safetensors");
  RLMESH_RETURN_IF_ERROR(CatchAll("load", [&]() -> absl::Status {
    RLMESH_RETURN_IF_ERROR(actor::LoadHfWeights(dir, s.policy));
    if (s.critic) {
      actor::LoadOptions lo;
      lo.add_value_head = true;
      RLMESH_RETURN_IF_ERROR(actor::LoadHfWeights(dir + "/critic", s.critic, lo));
    }
    RLMESH_ASSIGN_OR_RETURN(auto file, actor::SafetensorsFile::Open(opt_file));
    RLMESH_ASSIGN_OR_RETURN(at::Tensor m, file->Read("policy.exp_avg"));
    RLMESH_ASSIGN_OR_RETURN(at::Tensor v, file->Read("policy.exp_avg_sq"));
    RLMESH_RETURN_IF_ERROR(Prefix(opt_file, s.dp->LoadOptimizerState(m, v, ts.optimizer_steps)));
    if (s.critic_dp) {
      RLMESH_ASSIGN_OR_RETURN(at::Tensor cm, file->Read("critic.exp_avg"));
      RLMESH_ASSIGN_OR_RETURN(at::Tensor cv, file->Read("critic.exp_avg_sq"));
      RLMESH_RETURN_IF_ERROR(
          Prefix(opt_file, s.critic_dp->LoadOptimizerState(cm, cv, ts.critic_optimizer_steps)));
    }
    return absl::OkStatus();
  }));
  if (s.loader_data != nullptr) {
    s.loader = std::make_unique<PromptLoader>(s.loader_data, s.loader_seed,
                                              LoaderCursor{ts.loader_epoch, ts.loader_index});
  }
  step_ = ts.step;
  version_ = ts.policy_version;
  return absl::OkStatus();
}

}  // namespace rlmesh::learner
