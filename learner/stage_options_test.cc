// The config is validated in one place (NormalizeExperiment); the learner's
// stage options only convert it. These tests feed boundary values of every
// numeric, boolean and enum field a stage reads to both paths and check
// they agree: whatever the normaliser accepts, the learner accepts, and the
// options it builds pass the learner's own call-time checks (the Validate
// methods of the optimizer, schedule, loss, mismatch and GAE options).

#include "learner/stage_options.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "learner/advantages.h"
#include "learner/schedule.h"

namespace rlmesh::learner {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// One stage of each kind, valid as written.
ExperimentConfig Base() {
  ExperimentConfig e;
  REQUIRE(google::protobuf::TextFormat::ParseFromString(R"pb(
    name: "boundaries"
    model { hidden: 32 layers: 2 heads: 2 max_positions: 64 }
    task { kind: "arithmetic" digits: 1 train: 16 eval: 4 }
    rollout { sampling { max_new_tokens: 8 } }
    stages { sft { steps: 2 batch: 4 optimizer { lr: 1e-3 } } }
    stages { grpo { rl { steps: 2 prompts_per_step: 2 optimizer { lr: 1e-3 } } } }
    stages { ppo { rl { steps: 2 prompts_per_step: 2 optimizer { lr: 1e-3 } } } }
    stages { dpo { steps: 2 batch: 4 optimizer { lr: 1e-3 } } }
    stages { reward_model { steps: 2 batch: 4 optimizer { lr: 1e-3 } } }
  )pb", &e));
  return e;
}

// What the learner's own checks require of the options it built.
absl::Status CheckOptions(const StageOptions& o) {
  auto opt = [](const OptimizerOptions& x) -> absl::Status {
    absl::Status s = x.adamw.Validate();
    if (s.ok()) s = x.schedule.Validate();
    return s;
  };
  absl::Status s = opt(o.optimizer());
  if (!s.ok()) return s;
  if (o.learner.tp < 1 || o.learner.ep < 1 || o.learner.micro_tokens <= 0 || !(o.learner.temperature > 0) ||
      o.learner.checkpoint_keep <= 0) {
    return absl::InternalError("learner settings out of range");
  }
  if (o.is_pairs() && !(o.pairs.beta > 0)) return absl::InternalError("pairs.beta <= 0");
  if (!o.is_rl()) return absl::OkStatus();
  if (o.rl.epochs < 1 || o.rl.mini_batches < 1) return absl::InternalError("epochs/mini_batches < 1");
  if (!(o.rl.loss.clip_low > 0)) return absl::InternalError("clip_low <= 0");
  s = o.rl.loss.Validate();
  if (s.ok()) s = o.rl.mismatch.Validate();
  if (s.ok() && o.kind == StageKind::kPpo) {
    s = o.rl.gae.Validate();
    if (s.ok()) s = opt(o.rl.critic_optimizer);
    if (s.ok() && !(o.rl.value_clip > 0 && o.rl.vf_coef > 0)) s = absl::InternalError("value_clip/vf_coef");
  }
  if (s.ok() && o.rl.distill.on() && !(o.rl.distill.coef > 0)) s = absl::InternalError("distill.coef <= 0");
  return s;
}

struct Outcome {
  bool normalised = false;  // the normaliser accepted
  std::string learner_error;  // the learner refused what it accepted
};

Outcome BothPaths(const ExperimentConfig& raw) {
  Outcome out;
  ExperimentConfig cfg = raw;
  if (!NormalizeForLearner(&cfg, 1).ok()) return out;
  out.normalised = true;
  // A normalised config normalises to itself: the learner re-checks what
  // the coordinator sends without changing it.
  ExperimentConfig again = cfg;
  absl::Status s2 = NormalizeForLearner(&again, 1);
  if (!s2.ok() || again.SerializeAsString() != cfg.SerializeAsString()) {
    out.learner_error = absl::StrCat("normalising twice changed the config: ", s2.ToString());
    return out;
  }
  for (int i = 0; i < cfg.stages_size(); ++i) {
    absl::StatusOr<StageOptions> o = MakeStageOptions(cfg, i, 1);
    absl::Status s = o.ok() ? CheckOptions(*o) : o.status();
    if (!s.ok()) {
      out.learner_error = absl::StrCat("stage ", i, ": ", s.ToString());
      return out;
    }
  }
  return out;
}

const std::vector<double>& NumberBoundaries() {
  static const std::vector<double> v = {-1, 0, 1e-9, 0.5, 0.999, 1, 1.5, 2, 10, 16, 17, 64, 65, 1e6,
                                        std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity()};
  return v;
}

const std::vector<std::string>& Words() {
  static const std::vector<std::string> v = {
      "", "bogus", "grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo", "gspo", "cispo", "k1", "k2", "k3",
      "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "none", "tis",
      "mis", "icepop", "token", "sequence", "drop", "refill", "constant", "cosine", "fp32", "bf16", "off",
      "cache"};
  return v;
}

// Sets scalar field `f` of `m` to `x`; false when `x` does not fit its type.
bool SetNumber(Message* m, const FieldDescriptor* f, double x) {
  const Reflection* r = m->GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(m, f, x);
      return true;
    case FieldDescriptor::CPPTYPE_FLOAT:
      r->SetFloat(m, f, static_cast<float>(x));
      return true;
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
      if (!std::isfinite(x) || x != std::floor(x)) return false;
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
        r->SetInt32(m, f, static_cast<int32_t>(x));
      } else {
        r->SetInt64(m, f, static_cast<int64_t>(x));
      }
      return true;
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      if (!std::isfinite(x) || x < 0 || x != std::floor(x)) return false;
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32) {
        r->SetUInt32(m, f, static_cast<uint32_t>(x));
      } else {
        r->SetUInt64(m, f, static_cast<uint64_t>(x));
      }
      return true;
    default:
      return false;
  }
}

// Calls `visit(config, field path)` once per variant of `base`: every
// singular numeric, bool and string field under `root` (a message of
// `base`, found by `locate`) set to each boundary value, recursing into
// singular sub-messages.
using Locate = std::function<Message*(ExperimentConfig*)>;
using Visit = std::function<void(const ExperimentConfig&, const std::string&)>;

void Vary(const ExperimentConfig& base, const Locate& locate, const std::string& prefix, const Visit& visit) {
  ExperimentConfig probe = base;
  const Message* root = locate(&probe);
  const auto* d = root->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    // Another member of a oneof would change the stage's kind.
    if (f->containing_oneof() != nullptr && !root->GetReflection()->HasField(*root, f)) continue;
    const std::string path = prefix + "." + f->name();
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Vary(
          base,
          [locate, f](ExperimentConfig* c) {
            Message* parent = locate(c);
            return parent->GetReflection()->MutableMessage(parent, f);
          },
          path, visit);
      continue;
    }
    auto variant = [&](const auto& set, const std::string& shown) {
      ExperimentConfig c = base;
      set(locate(&c));
      visit(c, path + " = " + shown);
    };
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_BOOL) {
      for (bool b : {false, true}) variant([&](Message* m) { m->GetReflection()->SetBool(m, f, b); }, b ? "true" : "false");
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      for (const std::string& w : Words()) {
        variant([&](Message* m) { m->GetReflection()->SetString(m, f, w); }, "\"" + w + "\"");
      }
    } else {
      for (double x : NumberBoundaries()) {
        ExperimentConfig c = base;
        if (!SetNumber(locate(&c), f, x)) continue;
        visit(c, absl::StrCat(path, " = ", x));
      }
    }
  }
}

// Every field a stage reads, varied alone, on top of each of `bases`.
int CheckAllFields(const std::vector<ExperimentConfig>& bases, std::vector<std::string>* disagreements) {
  int accepted = 0;
  auto visit = [&](const ExperimentConfig& c, const std::string& what) {
    Outcome out = BothPaths(c);
    if (out.normalised) ++accepted;
    if (!out.learner_error.empty()) disagreements->push_back(what + ": " + out.learner_error);
  };
  for (const ExperimentConfig& base : bases) {
    for (int s = 0; s < base.stages_size(); ++s) {
      Vary(base, [s](ExperimentConfig* c) -> Message* { return c->mutable_stages(s); },
           absl::StrCat("stages[", s, "]"), visit);
    }
    Vary(base, [](ExperimentConfig* c) -> Message* { return c->mutable_learner(); }, "learner", visit);
    Vary(base, [](ExperimentConfig* c) -> Message* { return c->mutable_checkpoint(); }, "checkpoint", visit);
    Vary(base, [](ExperimentConfig* c) -> Message* { return c->mutable_rollout()->mutable_sampling(); },
         "rollout.sampling", visit);
  }
  return accepted;
}

TEST_CASE("every boundary value the normaliser accepts, the learner's stage options accept") {
  // Bases that switch on the settings other fields depend on: each mismatch
  // mode and level, each policy loss, dr_grpo, distillation, refill.
  std::vector<ExperimentConfig> bases = {Base()};
  for (const char* mode : {"none", "tis", "mis", "icepop"}) {
    for (const char* level : {"token", "sequence"}) {
      ExperimentConfig e = Base();
      for (int s : {1, 2}) {
        RlStage* rl = s == 1 ? e.mutable_stages(1)->mutable_grpo()->mutable_rl()
                             : e.mutable_stages(2)->mutable_ppo()->mutable_rl();
        rl->mutable_mismatch()->set_mode(mode);
        rl->mutable_mismatch()->set_level(level);
      }
      bases.push_back(e);
    }
  }
  {
    ExperimentConfig e = Base();
    e.mutable_stages(1)->mutable_grpo()->set_advantage("dr_grpo");
    e.mutable_stages(1)->mutable_grpo()->mutable_rl()->set_policy_loss("gspo");
    e.mutable_stages(2)->mutable_ppo()->mutable_rl()->set_policy_loss("cispo");
    bases.push_back(e);
  }
  {
    ExperimentConfig e = Base();
    RlStage* rl = e.mutable_stages(1)->mutable_grpo()->mutable_rl();
    rl->mutable_distillation()->set_teacher("/teacher");
    rl->mutable_dynamic_sampling();
    bases.push_back(e);
    rl->mutable_distillation()->set_task_reward(true);
    rl->mutable_dynamic_sampling()->set_mode("refill");
    rl->set_overlong_buffer(4);
    rl->mutable_kl()->set_coef(0.1);
    bases.push_back(e);
  }
  for (const ExperimentConfig& b : bases) REQUIRE(BothPaths(b).normalised);

  std::vector<std::string> disagreements;
  const int accepted = CheckAllFields(bases, &disagreements);
  INFO(disagreements.size() << " disagreements; the first: "
                            << (disagreements.empty() ? std::string("none") : disagreements.front()));
  CHECK(disagreements.empty());
  // The sweep reaches both sides of the boundaries.
  CHECK(accepted > 1000);
}

TEST_CASE("the learner refuses a config that did not come through the normaliser, naming the field") {
  ExperimentConfig e = Base();
  e.mutable_stages(1)->mutable_grpo()->mutable_rl()->mutable_optimizer()->set_lr(2.0);
  absl::Status s = NormalizeForLearner(&e, 1);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) == "experiment.stages[1].grpo.rl.optimizer.lr: must be in (0, 1)");
}

TEST_CASE("the learner converts the normalised values it is sent") {
  ExperimentConfig e = Base();
  RlStage* rl = e.mutable_stages(1)->mutable_grpo()->mutable_rl();
  rl->set_importance_cap(3.0);
  rl->mutable_optimizer()->set_grad_clip(-1);
  e.mutable_stages(2)->mutable_ppo()->set_gamma(0.99);
  REQUIRE(NormalizeForLearner(&e, 1).ok());
  absl::StatusOr<StageOptions> grpo = MakeStageOptions(e, 1, 1);
  REQUIRE(grpo.ok());
  // The tis cap given as importance_cap reaches the mismatch correction and
  // the loss; a grad_clip of -1 turns clipping off; unset values are the
  // documented defaults.
  CHECK(grpo->rl.mismatch.mode == MismatchMode::kTis);
  CHECK(grpo->rl.mismatch.high == 3.0);
  CHECK(grpo->rl.loss.importance_cap == 3.0);
  CHECK(grpo->rl.optimizer.grad_clip == -1);
  CHECK(grpo->rl.optimizer.adamw.beta2 == 0.999);
  CHECK(grpo->rl.epochs == 1);
  CHECK(grpo->rl.loss.clip_high == 0.2);
  CHECK(grpo->learner.micro_tokens == 8192);
  CHECK(grpo->learner.checkpoint_keep == 3);
  absl::StatusOr<StageOptions> ppo = MakeStageOptions(e, 2, 1);
  REQUIRE(ppo.ok());
  CHECK(ppo->rl.gae.gamma == 0.99);
  CHECK(ppo->rl.gae.lam == 0.95);
  CHECK(ppo->rl.value_clip == 0.2);
  CHECK(ppo->rl.critic_optimizer.schedule.peak_lr == 1e-3);
  // The batch is checked against the learner's own world.
  CHECK(MakeStageOptions(e, 0, 8).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlmesh::learner
