#include "learner/model_set.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "actor/autocast.h"
#include "actor/checkpoint.h"
#include "actor/lora.h"
#include "common/status_macros.h"
#include "dist/collective.h"
#include "dist/device.h"
#include "dist/nccl.h"
#include "learner/checkpoint.h"
#include "learner/trainer_internal.h"
#include "weight_sync/pieces.h"

namespace rlmesh::learner {

using parallel::TensorParallelModel;
using parallel::TensorParallelOptions;
using parallel::TensorParallelPiece;

namespace {

// Model construction draws from LibTorch's global generator; trainers running
// as threads of one process (tests) must not interleave there.
std::mutex& InitMutex() {
  static std::mutex mu;
  return mu;
}

// bf16 autocast over a forward pass (learner.autocast: bf16): matmuls run in
// bf16, reductions such as log_softmax in fp32, master weights stay fp32.
// Nothing when off.
class AutocastIf {
 public:
  AutocastIf(bool on, c10::DeviceType device_type) {
    if (on) scope_.emplace(device_type, actor::AutocastState{true, at::kBFloat16});
  }

 private:
  std::optional<actor::AutocastScope> scope_;
};

// The config field that names the stage's distillation teacher (what its
// errors are prefixed with).
std::string TeacherField(const StageOptions& stage) {
  return absl::StrCat(stage.field, ".", StageKindName(stage.kind), ".rl.distillation.teacher");
}

// On-policy distillation's teacher: frozen, on the policy's device. Its
// architecture and size are its own; what must agree with the policy is
// what the rows need: every token id the policy can sample, every position.
absl::StatusOr<actor::Transformer> LoadTeacher(const StageOptions& stage, const actor::ModelConfig& policy,
                                               const std::string& device) {
  const std::string field = TeacherField(stage);
  actor::LoadOptions lo;
  lo.device = device;
  absl::StatusOr<actor::Transformer> teacher = actor::LoadHfModel(stage.rl.distill.teacher, lo);
  if (!teacher.ok()) return PrefixStatus(field, teacher.status());
  const actor::ModelConfig& tc = (*teacher)->config();
  if (tc.vocab_size < policy.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": the teacher's vocabulary (", tc.vocab_size,
                                                   ") is smaller than the policy's (", policy.vocab_size,
                                                   "); teacher and policy need the same tokenizer"));
  }
  if (tc.max_positions < policy.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": the teacher's context (", tc.max_positions,
                                                   " positions) is shorter than the policy's (",
                                                   policy.max_positions, ")"));
  }
  for (auto& p : (*teacher)->parameters()) p.set_requires_grad(false);
  (*teacher)->eval();
  return teacher;
}

// Drops a module's parameter data, keeping its names and config.
void DropParameterData(actor::Transformer& m) {
  for (auto& [name, t] : m->NamedParameters()) t.set_data(at::empty({0}, t.options()));
}

}  // namespace

// The device boundary of the learner: batches are built on the CPU, the
// model may sit on a GPU. Inputs go to the model's device, per-token outputs
// ([B, T], small next to the forward pass) come back to the CPU, where the
// losses are computed; `to` is differentiable, so the backward pass reaches
// the parameters wherever they are. On the CPU every `to` is a no-op.
absl::StatusOr<actor::TokenLogProbsOutput> ModelSet::LogProbs(actor::Transformer& m, const at::Tensor& ids,
                                                              const at::Tensor& pos, const at::Tensor& targets,
                                                              int64_t chunk, double temperature,
                                                              const at::Tensor& attention_mask) {
  AutocastIf ac(autocast_bf16, device_type);
  // The reference of a LoRA stage is the policy module itself (by identity
  // of the handle passed, not of the module they share).
  std::optional<actor::AdaptersOff> base_only;
  if (reference_is_base && &m == &reference) base_only.emplace(policy);
  if (sharded && m.get() == policy.get()) {
    return sharded->TokenLogProbs(ids, pos, targets, temperature, attention_mask, chunk);
  }
  // Context parallelism (with tensor parallelism or not): this rank's
  // positions (0 elsewhere).
  ContextParallelModel* context = cp_policy && m.get() == policy.get()            ? cp_policy.get()
                                  : cp_reference && m.get() == reference.get() ? cp_reference.get()
                                  : cp_teacher && m.get() == teacher.get()     ? cp_teacher.get()
                                                                               : nullptr;
  if (context != nullptr) {
    RLMESH_ASSIGN_OR_RETURN(auto out, context->TokenLogProbs(ids, pos, targets, temperature, attention_mask));
    return out.out;
  }
  // Tensor parallelism: the vocabulary-parallel log-softmax never forms
  // the full logits, so there is nothing to chunk.
  if (tp_policy && m.get() == policy.get()) {
    return tp_policy->TokenLogProbs(ids, pos, targets, temperature, attention_mask);
  }
  if (tp_reference && m.get() == reference.get()) {
    return tp_reference->TokenLogProbs(ids, pos, targets, temperature, attention_mask);
  }
  // Pipeline parallelism: a no-grad pass through the stages; passes with
  // gradient run in the steps' schedules (PipelineModel::Train).
  PipelineModel* stage = pp_policy && m.get() == policy.get()            ? pp_policy.get()
                         : pp_reference && m.get() == reference.get() ? pp_reference.get()
                                                                      : nullptr;
  if (stage != nullptr) {
    if (at::GradMode::is_enabled()) {
      return absl::FailedPreconditionError(
          "LogProbs: under learner.pp a pass with gradient runs through PipelineModel::Train");
    }
    RLMESH_ASSIGN_OR_RETURN(auto out, stage->LogProbs({{ids, pos, targets, attention_mask}}, temperature));
    return out[0];
  }
  // Expert parallelism: the same module code, with the experts' exchange.
  actor::Transformer& module = ep_policy && m.get() == policy.get() ? ep_policy->model() : m;
  const c10::Device dev = module->LmHeadWeight().device();
  const at::Tensor mask = attention_mask.defined() ? attention_mask.to(dev) : attention_mask;
  auto out = actor::TokenLogProbs(module, ids.to(dev), pos.to(dev), targets.to(dev), chunk, temperature, mask);
  if (!out.ok() || dev.is_cpu()) return out;
  out->logprobs = out->logprobs.to(at::kCPU);
  if (out->entropy.defined()) out->entropy = out->entropy.to(at::kCPU);
  return out;
}

absl::StatusOr<at::Tensor> ModelSet::Values(actor::Transformer& m, const at::Tensor& ids, const at::Tensor& pos,
                                            const at::Tensor& attention_mask) {
  AutocastIf ac(autocast_bf16, device_type);
  // Values in fp32 (a bf16 value head under autocast), as below.
  auto fp32 = [](absl::StatusOr<at::Tensor> v) -> absl::StatusOr<at::Tensor> {
    if (v.ok()) return v->to(at::kFloat);
    return v;
  };
  const at::Tensor& mask = attention_mask;
  if (sharded && m.get() == policy.get()) return fp32(sharded->Values(ids, pos, mask));
  if (tp_policy && m.get() == policy.get()) return tp_policy->Values(ids, pos, mask);
  if (sharded_critic && m.get() == critic.get()) return fp32(sharded_critic->Values(ids, pos, mask));
  if (tp_critic && m.get() == critic.get()) return tp_critic->Values(ids, pos, mask);
  const c10::Device dev = m->LmHeadWeight().device();
  return m->Values(ids.to(dev), pos.to(dev), mask.defined() ? mask.to(dev) : mask).to(at::kFloat).to(at::kCPU);
}

absl::Status ModelSet::ZeroGradPolicy(double local_weight) {
  if (sharded) {
    sharded->ZeroGrad(local_weight);
  } else if (pp_policy) {
    pp_policy->ZeroGrad();
  } else if (ep_policy) {
    ep_policy->ZeroGrad();
    // The experts' gradients gather every rank's tokens: their scale needs
    // the global weight before the backward passes.
    return ep_policy->PrepareBackward(local_weight);
  } else {
    dp->ZeroGrad();
  }
  return absl::OkStatus();
}

absl::StatusOr<DataParallelStepStats> ModelSet::StepPolicy(double local_weight, double lr) {
  // ZeRO-3 took the local weight at ZeroGradPolicy: its gradients were
  // reduce-scattered during the backward passes.
  if (sharded) return sharded->Step(lr);
  if (ep_policy) return ep_policy->Step(lr);
  if (pp_policy) return pp_policy->Step(local_weight, lr);
  return dp->Step(local_weight, lr);
}

absl::Status ModelSet::ZeroGradCritic(double local_weight) {
  if (sharded_critic) {
    sharded_critic->ZeroGrad(local_weight);
  } else if (critic_dp) {
    critic_dp->ZeroGrad();
  }
  return absl::OkStatus();
}

absl::StatusOr<DataParallelStepStats> ModelSet::StepCritic(double local_weight, double lr) {
  if (sharded_critic) return sharded_critic->Step(lr);
  if (critic_dp) return critic_dp->Step(local_weight, lr);
  return absl::FailedPreconditionError("no critic");
}

int64_t ModelSet::CriticSteps() const {
  if (sharded_critic) return sharded_critic->steps();
  return critic_dp ? critic_dp->steps() : 0;
}

absl::Status ModelSet::GatherCritic() {
  if (tp_critic) {
    // The replicas hold the same slices: replica 0's ranks gather them.
    if (critic_dp->rank() != 0) return absl::OkStatus();
    RLMESH_ASSIGN_OR_RETURN(auto full, tp_critic->GatherFull());
    if (tp_critic->rank() != 0) return absl::OkStatus();
    return CatchAll("gather the critic", [&]() -> absl::Status {
      std::map<std::string, at::Tensor> by_name(full.begin(), full.end());
      for (auto& [name, p] : critic->NamedParameters()) {
        auto it = by_name.find(name);
        if (it == by_name.end()) return absl::InternalError(absl::StrCat("gather the critic: ", name, " missing"));
        p.set_data(it->second);
      }
      return absl::OkStatus();
    });
  }
  if (!sharded_critic) return absl::OkStatus();
  const bool keep = sharded_critic->world_rank() == 0;
  std::map<std::string, at::Tensor> params;
  if (keep) {
    for (auto& [name, p] : critic->NamedParameters()) params.emplace(name, p);
  }
  return CatchAll("gather the critic", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    return sharded_critic->VisitFull([&](const std::string& name, const at::Tensor& t) -> absl::Status {
      if (!keep) return absl::OkStatus();
      auto it = params.find(name);
      if (it == params.end()) return absl::InternalError(absl::StrCat("gather the critic: ", name, " is not in it"));
      it->second.set_data(t.clone());
      return absl::OkStatus();
    });
  });
}

void ModelSet::DropGatheredCritic() {
  if (sharded_critic || tp_critic) DropParameterData(critic);
}

absl::Status ModelSet::LoadCriticWeights(const std::string& dir) {
  actor::LoadOptions lo;
  lo.add_value_head = true;
  if (!sharded_critic && !tp_critic) return actor::LoadHfWeights(dir, critic, lo);
  return CatchAll("load critic", [&]() -> absl::Status {
    actor::Transformer full{nullptr};
    {
      std::lock_guard<std::mutex> lock(InitMutex());
      full = actor::Transformer(critic->config());
    }
    RLMESH_RETURN_IF_ERROR(actor::LoadHfWeights(dir, full, lo));
    if (tp_critic) return tp_critic->LoadFromFull(full->NamedParameters());
    return sharded_critic->LoadFromFull(full->NamedParameters());
  });
}

int64_t ModelSet::PolicySteps() const {
  if (sharded) return sharded->steps();
  if (ep_policy) return ep_policy->optimizer_steps();
  if (pp_policy) return pp_policy->steps();
  return dp->steps();
}

at::Tensor ModelSet::ContextMask(int64_t rows, int64_t T) const {
  if (!cp_group) return at::ones({rows, T}, at::kFloat);
  return ZigZagMask(rows, T, cp_group->getRank(), cp_group->getSize());
}

absl::Status ModelSet::ShareContextTokens(at::Tensor& t) {
  if (!cp_group) return absl::OkStatus();
  if (!t.is_contiguous()) return absl::InvalidArgumentError("ShareContextTokens: expected a contiguous tensor");
  return dist::Collective("sum of the context-parallel ranks' tokens", [&] {
    std::vector<at::Tensor> v = {t};
    cp_group->allreduce(v)->wait();
  });
}

absl::StatusOr<at::Tensor> ModelSet::ContextSum(const at::Tensor& partial) {
  if (!cp_group) return partial;
  at::Tensor total = partial.detach().contiguous().clone();
  RLMESH_RETURN_IF_ERROR(ShareContextTokens(total));
  // The group's sum as the value; d total / d partial = 1.
  return partial + (total - partial.detach());
}

absl::Status ModelSet::ShareContextMeans(MetricMeans* means, double* weight) {
  if (!cp_group) return absl::OkStatus();
  std::vector<double> sums = means->Sums();
  // The names must agree: their count and a digest of them travel along.
  uint64_t digest = 1469598103934665603ull;
  for (const std::string& k : means->Keys()) {
    for (char ch : k) digest = (digest ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  }
  // [n, -n, d, -d] under MAX: every rank sees whether the largest and the
  // smallest agree, before a sum whose sizes would differ.
  const double n = static_cast<double>(sums.size()), d = static_cast<double>(digest >> 12);
  at::Tensor check = at::tensor({n, -n, d, -d}, at::kDouble);
  at::Tensor v = at::tensor(sums, at::kDouble);
  if (weight != nullptr) v = at::cat({v, at::full({1}, *weight, at::kDouble)});
  RLMESH_RETURN_IF_ERROR(dist::Collective("agreement on the context-parallel ranks' metrics", [&] {
    std::vector<at::Tensor> c = {check};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    cp_group->allreduce(c, o)->wait();
  }));
  const double* k = check.data_ptr<double>();
  if (k[0] != -k[1] || k[2] != -k[3]) {
    return absl::InternalError("ShareContextMeans: the context-parallel ranks hold different metric names");
  }
  RLMESH_RETURN_IF_ERROR(dist::Collective("sum of the context-parallel ranks' metrics", [&] {
    if (v.numel() == 0) return;
    std::vector<at::Tensor> x = {v};
    cp_group->allreduce(x)->wait();
  }));
  const double* p = v.data_ptr<double>();
  means->SetSums(std::vector<double>(p, p + sums.size()));
  if (weight != nullptr) *weight = p[sums.size()];
  return absl::OkStatus();
}

absl::Status ModelSet::AllReduceSum(at::Tensor& t) {
  if (dp && !cp_policy) return dp->AllReduceSum(t);
  if (!t.defined() || !t.is_contiguous() || !t.device().is_cpu()) {
    return absl::InvalidArgumentError("t: expected a defined contiguous CPU tensor");
  }
  // A pipeline's stages (a context-parallel group's ranks) hold the same
  // rows: the replicas' sum.
  const c10::intrusive_ptr<c10d::Backend>& over = pp_policy ? dp_group : cp_policy ? cp_replicas : group;
  if (!over) return absl::OkStatus();
  return dist::CollectiveOn("all-reduce of statistics", device, t, [&](at::Tensor& x) {
    std::vector<at::Tensor> v = {x};
    over->allreduce(v)->wait();
  });
}

absl::Status ModelSet::ShareLastStageMetrics(google::protobuf::Map<std::string, double>* m) {
  if (!pp_group) return absl::OkStatus();
  const int last = pp_group->getSize() - 1;
  const bool sender = pp_group->getRank() == last;
  // Names joined by NUL bytes, then the values, after their two sizes.
  std::string names;
  std::vector<double> values;
  if (sender) {
    for (const auto& [k, v] : *m) {
      names += k;
      names.push_back('\0');
      values.push_back(v);
    }
  }
  return dist::Collective("broadcast of the step's metrics", [&] {
    c10d::BroadcastOptions root;
    root.rootRank = last;
    std::vector<at::Tensor> sizes{at::tensor({static_cast<int64_t>(names.size()), static_cast<int64_t>(values.size())},
                                             at::kLong)};
    pp_group->broadcast(sizes, root)->wait();
    const int64_t n_bytes = sizes[0][0].item<int64_t>(), n_values = sizes[0][1].item<int64_t>();
    std::vector<at::Tensor> bytes{at::empty({n_bytes}, at::kByte)}, vals{at::empty({n_values}, at::kDouble)};
    if (sender) {
      std::memcpy(bytes[0].data_ptr(), names.data(), n_bytes);
      std::memcpy(vals[0].data_ptr(), values.data(), n_values * sizeof(double));
    }
    pp_group->broadcast(bytes, root)->wait();
    pp_group->broadcast(vals, root)->wait();
    if (sender) return;
    m->clear();
    const char* p = static_cast<const char*>(bytes[0].data_ptr());
    const double* v = vals[0].data_ptr<double>();
    for (int64_t i = 0, at = 0; i < n_values; ++i) {
      const std::string k(p + at);
      at += static_cast<int64_t>(k.size()) + 1;
      (*m)[k] = v[i];
    }
  });
}

absl::StatusOr<int64_t> ModelSet::MaxOverGroup(int64_t n) {
  if (!group) return n;
  at::Tensor t = at::full({1}, n, at::kLong);
  RLMESH_RETURN_IF_ERROR(dist::CollectiveOn("all-reduce of a count", device, t, [&](at::Tensor& x) {
    std::vector<at::Tensor> v = {x};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    group->allreduce(v, o)->wait();
  }));
  return t.item<int64_t>();
}

absl::Status ModelSet::EmptyPolicyPass(bool backward, bool with_policy) {
  if (!AlignedPasses()) return absl::OkStatus();
  // One token whose target is masked (-1): its log-prob is 0 and carries no
  // gradient, but every unit is gathered, run and reduce-scattered (ZeRO-3),
  // every MoE layer's exchange made (EP).
  const at::Tensor zero = at::zeros({1, 1}, at::kLong);
  at::Tensor out = at::zeros({}, at::kFloat);
  if (with_policy && (sharded || ep_policy)) {
    if (policy->config().value_head) {
      // A reward model's passes are value passes.
      RLMESH_ASSIGN_OR_RETURN(at::Tensor v, Values(policy, zero, zero));
      out = v.sum();
    } else {
      RLMESH_ASSIGN_OR_RETURN(auto lp, LogProbs(policy, zero, zero, at::full({1, 1}, -1, at::kLong), 1, 1.0));
      out = lp.logprobs.sum();
    }
  }
  if (sharded_critic) {
    // After the policy, as in a real pass, with one backward over both: the
    // units' collectives come in the same order as a real pass's.
    RLMESH_ASSIGN_OR_RETURN(at::Tensor v, Values(critic, zero, zero));
    out = out + v.sum();
  }
  if (backward && out.requires_grad()) {
    return CatchAll("empty backward", [&]() -> absl::Status {
      (out * 0).backward();
      return absl::OkStatus();
    });
  }
  return absl::OkStatus();
}

absl::Status ModelSet::SyncPolicy() {
  if (whole_on_demand) {
    whole_fresh = false;
    DropParameterData(policy);
    return RefreshSyncSlices();
  }
  return GatherIntoRank0();
}

namespace {

// Sets `slices`' entry for parameter `name` to slice `slice` of `slices_n`
// of its whole tensor `full` (a copy: `full` may be a transient buffer).
absl::Status SetSyncSlice(std::vector<std::pair<std::string, at::Tensor>>& slices, const std::string& name,
                          const at::Tensor& full, int slice, int slices_n) {
  auto cut = TensorParallelPiece(name, full, 0, 1, slice, slices_n);
  if (!cut.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "experiment.learner.zero: 3 sends the weights in pieces, each learner rank its slice of ", slices_n,
        ", and ", cut.status().message(), "; set weight_sync.whole_model: true to send the whole model from rank 0"));
  }
  for (auto& [n, t] : slices) {
    if (n != name) continue;
    if (t.defined() && t.sizes() == cut->sizes()) {
      t.copy_(*cut);
    } else {
      t = cut->clone();
    }
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("sync slices: ", name, " is not a policy parameter"));
}

}  // namespace

absl::Status ModelSet::RefreshSyncSlices() {
  if (!zero3_sync_slices) return absl::OkStatus();
  return CatchAll("sync slices", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    return sharded->VisitFull([&](const std::string& name, const at::Tensor& full) {
      return SetSyncSlice(sync_slices, name, full, sharded->world_rank(), sharded->world_size());
    });
  });
}

absl::Status ModelSet::CutSyncSlices(const std::vector<std::pair<std::string, at::Tensor>>& full) {
  if (!zero3_sync_slices) return absl::OkStatus();
  return CatchAll("sync slices", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    // The names in the policy's order, each then refreshed in place.
    sync_slices.clear();
    for (const auto& [name, t] : full) {
      sync_slices.emplace_back(name, at::Tensor());
      RLMESH_RETURN_IF_ERROR(SetSyncSlice(sync_slices, name, t, sharded->world_rank(), sharded->world_size()));
    }
    return absl::OkStatus();
  });
}

absl::Status ModelSet::GatherPolicy() {
  if (!whole_on_demand || whole_fresh) return absl::OkStatus();
  RLMESH_RETURN_IF_ERROR(GatherIntoRank0());
  whole_fresh = true;
  return absl::OkStatus();
}

absl::Status ModelSet::GatherIntoRank0() {
  std::vector<std::pair<std::string, at::Tensor>> full;
  if (sharded) {
    // Unit by unit: only rank 0 keeps anything, so the other ranks never
    // hold more than one gathered unit.
    const bool keep = sharded->world_rank() == 0;
    std::map<std::string, at::Tensor> params;
    if (keep) {
      for (auto& [name, p] : policy->NamedParameters()) params.emplace(name, p);
    }
    size_t visited = 0;
    return CatchAll("sync policy", [&]() -> absl::Status {
      at::NoGradGuard no_grad;
      RLMESH_RETURN_IF_ERROR(sharded->VisitFull([&](const std::string& name, const at::Tensor& t) -> absl::Status {
        if (!keep) return absl::OkStatus();
        ++visited;
        auto it = params.find(name);
        if (it == params.end()) return absl::InternalError(absl::StrCat("sync policy: ", name, " is not in the policy"));
        at::Tensor& p = it->second;
        // A copy dropped between checkpoints (whole_on_demand) takes a
        // clone of the gathered view.
        if (p.sizes() == t.sizes()) {
          p.copy_(t);
        } else {
          p.set_data(t.to(p.options()).clone().contiguous());
        }
        return absl::OkStatus();
      }));
      if (visited != params.size()) {
        return absl::InternalError(
            absl::StrCat("sync policy: ", visited, " parameters gathered for ", params.size()));
      }
      return absl::OkStatus();
    });
  } else if (tp_policy) {
    // The replicas hold the same slices: replica 0's ranks gather them.
    if (dp->rank() != 0) return absl::OkStatus();
    RLMESH_ASSIGN_OR_RETURN(full, tp_policy->GatherFull());
    if (tp_policy->rank() != 0) return absl::OkStatus();
  } else if (pp_policy) {
    // The replicas hold the same stages: replica 0's stages gather them,
    // to its rank 0.
    if (dp_group && dp_group->getRank() != 0) return absl::OkStatus();
    RLMESH_ASSIGN_OR_RETURN(full, pp_policy->GatherToFirst());
    if (pp_policy->stage() != 0 || pp_policy->tensor_parallel_rank() != 0) return absl::OkStatus();
  } else if (ep_policy) {
    // The groups hold the same experts: the first group's ranks gather them.
    const int world_rank = group ? group->getRank() : 0;
    if (world_rank >= ep_policy->size()) return absl::OkStatus();
    RLMESH_ASSIGN_OR_RETURN(full, ep_policy->GatherFull());
    if (ep_policy->rank() != 0) return absl::OkStatus();
  } else {
    return absl::OkStatus();
  }
  return CatchAll("sync policy", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> by_name(full.begin(), full.end());
    for (auto& [name, p] : policy->NamedParameters()) {
      auto it = by_name.find(name);
      if (it == by_name.end()) return absl::InternalError(absl::StrCat("sync policy: ", name, " not gathered"));
      // A copy dropped between checkpoints (whole_on_demand) takes the
      // gathered tensor itself.
      if (p.sizes() == it->second.sizes()) {
        p.copy_(it->second);
      } else {
        p.set_data(it->second.to(p.options()).contiguous());
      }
    }
    return absl::OkStatus();
  });
}

namespace {

// Named full-size views into `flat`, plain DP's flat optimizer layout over
// `shapes`. INVALID_ARGUMENT when its size is not the policy's.
absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> SplitInPolicyOrder(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes, const at::Tensor& flat,
    const char* what) {
  int64_t total = 0;
  for (const auto& [name, shape] : shapes) total += c10::multiply_integers(shape);
  if (!flat.defined() || flat.dim() != 1 || flat.numel() != total) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", flat.defined() ? flat.numel() : 0,
                                                   " elements, the policy has ", total));
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  int64_t offset = 0;
  for (const auto& [name, shape] : shapes) {
    const int64_t n = c10::multiply_integers(shape);
    out.emplace_back(name, flat.narrow(0, offset, n).view(shape));
    offset += n;
  }
  return out;
}

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// A tensor-parallel model's slices (`dp` steps them) of the whole model's
// moments in plain DP's layout (`shapes`), loaded into `dp` (ZeRO-1 keeps
// its share).
// `what` names the tensors ("policy", "critic").
absl::Status LoadTensorParallelMoments(const TensorParallelModel& model, DataParallel& dp, bool zero1,
                                       const Shapes& shapes, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                                       int64_t steps, const std::string& what) {
  return CatchAll("moments", [&]() -> absl::Status {
    RLMESH_ASSIGN_OR_RETURN(auto m, SplitInPolicyOrder(shapes, exp_avg, (what + ".exp_avg").c_str()));
    RLMESH_ASSIGN_OR_RETURN(auto v, SplitInPolicyOrder(shapes, exp_avg_sq, (what + ".exp_avg_sq").c_str()));
    RLMESH_ASSIGN_OR_RETURN(std::vector<at::Tensor> ms, model.SliceOf(m, /*trained_only=*/true));
    RLMESH_ASSIGN_OR_RETURN(std::vector<at::Tensor> vs, model.SliceOf(v, /*trained_only=*/true));
    return zero1 ? dp.LoadWholeOptimizerState(FlattenAll(ms), FlattenAll(vs), steps)
                 : dp.LoadOptimizerState(FlattenAll(ms), FlattenAll(vs), steps);
  });
}

}  // namespace

absl::StatusOr<std::pair<at::Tensor, at::Tensor>> ModelSet::PolicyMoments() {
  if (sharded || (tp_policy && !zero1)) {
    return absl::FailedPreconditionError("PolicyMoments: ZeRO-3's and TP's moments are gathered as a save writes them");
  }
  // EP: each rank its own parameters' (a per-rank file).
  if (ep_policy) return std::make_pair(ep_policy->exp_avg(), ep_policy->exp_avg_sq());
  // PP: the whole model's, plain DP's layout, gathered over the pipeline
  // (every stage must call it).
  if (pp_policy) return pp_policy->GatherMoments();
  // Plain DP, and ZeRO-1 (each rank its share, tp or not: a per-rank file).
  return std::make_pair(dp->exp_avg(), dp->exp_avg_sq());
}

absl::Status ModelSet::LoadPolicyMoments(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t steps,
                                         bool whole) {
  if (sharded) return sharded->LoadMoments(exp_avg, exp_avg_sq, steps);
  if (pp_policy) return pp_policy->LoadMoments(exp_avg, exp_avg_sq, steps);
  if (ep_policy) {
    if (!whole) return ep_policy->LoadOptimizerState(exp_avg, exp_avg_sq, steps);
    return CatchAll("moments", [&]() -> absl::Status {
      RLMESH_ASSIGN_OR_RETURN(auto m, SplitInPolicyOrder(policy_shapes, exp_avg, "policy.exp_avg"));
      RLMESH_ASSIGN_OR_RETURN(auto v, SplitInPolicyOrder(policy_shapes, exp_avg_sq, "policy.exp_avg_sq"));
      return ep_policy->LoadWholeMoments(m, v, steps);
    });
  }
  // ZeRO-1 from its own share (a per-rank file of the same layout).
  if (zero1 && !whole) return dp->LoadOptimizerState(exp_avg, exp_avg_sq, steps);
  // dp's every element: ZeRO-1 keeps its share of them.
  if (!tp_policy) {
    return zero1 ? dp->LoadWholeOptimizerState(exp_avg, exp_avg_sq, steps)
                 : dp->LoadOptimizerState(exp_avg, exp_avg_sq, steps);
  }
  return LoadTensorParallelMoments(*tp_policy, *dp, zero1, policy_shapes, exp_avg, exp_avg_sq, steps, "policy");
}

absl::StatusOr<std::pair<at::Tensor, at::Tensor>> ModelSet::CriticMoments() {
  if (sharded_critic || (tp_critic && !zero1)) {
    return absl::FailedPreconditionError("CriticMoments: ZeRO-3's and TP's moments are gathered as a save writes them");
  }
  if (!critic_dp) return std::make_pair(at::Tensor(), at::Tensor());
  // Whole on every rank, or ZeRO-1 (this rank's share, tp or not).
  return std::make_pair(critic_dp->exp_avg(), critic_dp->exp_avg_sq());
}

absl::Status ModelSet::LoadCriticMoments(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t steps,
                                         bool whole) {
  if (sharded_critic) return sharded_critic->LoadMoments(exp_avg, exp_avg_sq, steps);
  if (!critic_dp) return absl::OkStatus();
  if (!whole) return critic_dp->LoadOptimizerState(exp_avg, exp_avg_sq, steps);
  // Whole on every rank: ZeRO-1 or not, critic_dp was built with the
  // learner's setting, and LoadWholeOptimizerState keeps its share.
  if (!tp_critic) return critic_dp->LoadWholeOptimizerState(exp_avg, exp_avg_sq, steps);
  return LoadTensorParallelMoments(*tp_critic, *critic_dp, zero1, critic_shapes, exp_avg, exp_avg_sq, steps,
                                   "critic");
}

absl::Status ModelSet::LoadPolicyWeights(const std::string& dir, int rank) {
  if (!PolicySplit()) return actor::LoadHfWeights(dir, policy);
  return CatchAll("load policy", [&]() -> absl::Status {
    actor::Transformer full{nullptr};
    if (rank == 0 && !whole_on_demand) {
      full = policy;
    } else {
      std::lock_guard<std::mutex> lock(InitMutex());
      full = actor::Transformer(policy->config());
    }
    RLMESH_RETURN_IF_ERROR(actor::LoadHfWeights(dir, full));
    const auto named = full->NamedParameters();
    if (sharded) {
      RLMESH_RETURN_IF_ERROR(sharded->LoadFromFull(named));
      whole_fresh = false;
      return CutSyncSlices(named);
    }
    if (ep_policy) return ep_policy->LoadFromFull(named);
    if (pp_policy) return pp_policy->LoadFromFull(named);
    whole_fresh = false;
    return tp_policy->LoadFromFull(named);
  });
}

absl::StatusOr<LoadedPolicy> LoadPolicy(const ExperimentConfig& exp, const std::string& init_checkpoint,
                                        const StageOptions& stage, const actor::Tokenizer& tokenizer,
                                        ModelSet* models) {
  ModelSet& s = *models;
  LoadedPolicy out;
  s.autocast_bf16 = stage.learner.autocast_bf16;
  const ModelConfig& mc = exp.model();
  const std::string dtype = mc.dtype().empty() ? "fp32" : mc.dtype();
  if (dtype != "fp32" && dtype != "float32") {
    return absl::InvalidArgumentError("experiment.model.dtype: the learner trains fp32 master weights");
  }
  const std::string device = mc.device().empty() ? "cpu" : mc.device();
  // Loads LibTorch's CUDA backend for a CUDA device; the error names the
  // device and what is missing (no GPU, no driver, index past the visible).
  RLMESH_ASSIGN_OR_RETURN(const c10::Device resolved, dist::ResolveDevice(device, "learner experiment.model.device"));
  s.device_type = resolved.type();
  s.device = resolved;
  std::string init_path = init_checkpoint;
  const std::string init = mc.init().empty() ? "scratch" : mc.init();
  if (init_path.empty() && init == "checkpoint") {
    if (mc.path().empty()) return absl::InvalidArgumentError("experiment.model.path: required when init is checkpoint");
    init_path = mc.path();
  } else if (init_path.empty() && init != "scratch") {
    return absl::InvalidArgumentError(
        absl::StrCat("experiment.model.init: \"", init, "\" is not scratch or checkpoint"));
  }
  actor::ModelConfig cfg;
  const bool reward_model = stage.kind == StageKind::kRewardModel;
  if (!init_path.empty()) {
    actor::LoadOptions lo;
    lo.device = device;
    // A folder with a LoRA adapter holds the policy base + adapter: this
    // stage starts from their sum (and trains fresh adapters on it).
    lo.merge_adapter = true;
    if (reward_model) {
      // A reward model starts from a policy: its scalar head is fresh
      // (seeded), or read back when the checkpoint already has one.
      lo.add_value_head = true;
      lo.allow_missing_value_head = true;
    }
    absl::StatusOr<actor::Transformer> model = absl::UnknownError("not loaded");
    {
      std::lock_guard<std::mutex> lock(InitMutex());
      at::manual_seed(Mix(exp.seed(), 0x5c0e));
      model = actor::LoadHfModel(init_path, lo);
    }
    if (!model.ok()) return PrefixStatus("init_checkpoint", model.status());
    s.policy = *std::move(model);
    cfg = s.policy->config();
    // Versions increase over the stages of an experiment.
    auto prev = VerifyCheckpoint(init_path);
    if (prev.ok()) out.policy_version = prev->policy_version;
  } else {
    cfg.arch = mc.arch().empty() ? "llama" : mc.arch();
    cfg.vocab_size = tokenizer.vocab_size();
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
    cfg.bos_token_id = tokenizer.bos_id();
    cfg.eos_token_id = tokenizer.eos_id();
    cfg.pad_token_id = tokenizer.pad_id();
    cfg.value_head = reward_model;
    RLMESH_RETURN_IF_ERROR(PrefixStatus("experiment.model", cfg.Validate()));
    // A scratch model is built here, on the host, before anything else can
    // fail: refuse one whose training state alone (weights, gradients and
    // AdamW's moments with DataParallel's flat copies: 24 bytes a
    // parameter, bench/learner_memory.py) exceeds this machine's memory,
    // rather than spend minutes filling it.
    const int64_t head_dim = cfg.head_dim > 0 ? cfg.head_dim : cfg.hidden_size / cfg.num_heads;
    const double params =
        2.0 * cfg.vocab_size * cfg.hidden_size +
        static_cast<double>(cfg.num_layers) * cfg.hidden_size *
            (2.0 * head_dim * (cfg.num_heads + cfg.num_kv_heads) + 3.0 * cfg.intermediate_size);
    const double host_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
    if (host_bytes > 0 && 24.0 * params > host_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "experiment.model: a scratch model of about ", static_cast<int64_t>(params / 1e6),
          "M parameters needs about ", static_cast<int64_t>(24.0 * params / (1 << 30)),
          " GiB to train, more than this host's ", static_cast<int64_t>(host_bytes / (1 << 30)), " GiB"));
    }
    RLMESH_RETURN_IF_ERROR(CatchAll("build policy", [&]() -> absl::Status {
      std::lock_guard<std::mutex> lock(InitMutex());
      at::manual_seed(exp.seed());
      s.policy = actor::Transformer(cfg);
      s.policy->to(c10::Device(device));
      return absl::OkStatus();
    }));
  }
  if (cfg.vocab_size < tokenizer.vocab_size()) {
    return absl::InvalidArgumentError("experiment.model.tokenizer: vocabulary larger than the model's");
  }
  if (init_checkpoint.empty() && !mc.lora().path().empty()) {
    // The experiment's own starting point: model.lora.path is merged in.
    RLMESH_RETURN_IF_ERROR(CatchAll("model.lora.path", [&]() -> absl::Status {
      RLMESH_RETURN_IF_ERROR(PrefixStatus("experiment.model.lora.path", actor::LoadAdapter(mc.lora().path(), s.policy)));
      actor::MergeLora(s.policy);
      return absl::OkStatus();
    }));
  }
  out.config = cfg;
  return out;
}

namespace {

// The adapters `stage` trains (model.lora, when its kind is listed), or none.
std::optional<actor::LoraSpec> StageLora(const ExperimentConfig& exp, const StageOptions& stage) {
  const LoraConfig& l = exp.model().lora();
  if (l.rank() <= 0) return std::nullopt;
  const std::string kind(StageKindName(stage.kind));
  bool listed = l.stages_size() == 0;
  for (const std::string& k : l.stages()) listed = listed || k == kind;
  if (!listed) return std::nullopt;
  actor::LoraSpec spec;
  spec.rank = l.rank();
  spec.alpha = l.alpha() > 0 ? l.alpha() : l.rank();
  spec.dropout = l.dropout();
  spec.targets.assign(l.targets().begin(), l.targets().end());
  if (spec.targets.empty()) spec.targets = actor::LoraTargetNames();
  spec.init = l.init().empty() ? "default" : l.init();
  return spec;
}

}  // namespace

namespace {

// ZeRO-3, TP and EP: rank 0's policy weights broadcast to every rank (over the
// whole group) and copied into the reference, when there is one; records
// the policy's shapes before a split frees its data.
absl::Status BroadcastPolicy(ModelSet* models) {
  ModelSet& s = *models;
  at::NoGradGuard no_grad;
  auto named = s.policy->NamedParameters();
  s.policy_shapes.clear();
  // A reward model's lm_head is out of the optimizer (plain DP's layout).
  const bool value_head = s.policy->config().value_head;
  for (auto& [name, t] : named) {
    if (value_head && name == "lm_head.weight") continue;
    s.policy_shapes.emplace_back(name, t.sizes().vec());
  }
  if (s.group) {
    RLMESH_RETURN_IF_ERROR(dist::Collective("broadcast of the policy", [&] {
      for (auto& [name, t] : named) {
        std::vector<at::Tensor> v = {t};
        s.group->broadcast(v)->wait();
      }
    }));
  }
  if (s.reference) {
    auto dst = s.reference->NamedParameters();
    for (size_t i = 0; i < named.size(); ++i) dst[i].second.copy_(named[i].second);
  }
  return absl::OkStatus();
}

// learner.tp > 1: this rank's tensor-parallel group (its replica's ranks)
// and data-parallel group (the ranks of every replica that hold the same
// slices). Rank r is tensor-parallel rank r % tp of replica r / tp. Every
// rank joins its replica's group, then the other: the same order
// everywhere, so no rendezvous waits on another.
// Rank `group_rank` of a Gloo group of `size` ranks with keys under
// `prefix` of the learner's store; null for a group of one.
absl::Status JoinSubgroup(const ModelSet& s, const std::string& prefix, int group_rank, int size,
                          const dist::GlooGroupOptions& gloo, c10::intrusive_ptr<c10d::Backend>* group) {
  if (size == 1) return absl::OkStatus();
  RLMESH_ASSIGN_OR_RETURN(*group, dist::CreateGlooGroup(dist::WithPrefix(s.store, prefix), group_rank, size, gloo));
  return absl::OkStatus();
}

absl::Status JoinTensorParallelGroups(const StageOptions& stage, int rank, int world_size,
                                      const dist::GlooGroupOptions& gloo, ModelSet* models) {
  ModelSet& s = *models;
  const int tp = stage.learner.tp, replica = rank / tp, tp_rank = rank % tp, replicas = world_size / tp;
  RLMESH_RETURN_IF_ERROR(JoinSubgroup(s, absl::StrCat("tp", replica), tp_rank, tp, gloo, &s.tp_group));
  return JoinSubgroup(s, absl::StrCat("dp", tp_rank), replica, replicas, gloo, &s.dp_group);
}

// learner.cp > 1: this replica's context-parallel group (the ranks with
// the same tensor-parallel slices: rank r is tensor rank r % tp and context
// rank (r / tp) % cp of replica r / (tp * cp)) and the replicas holding the
// same share of the tokens and the same slices; the policy and reference
// run over the former, sharing their modules (under TP the split models').
// The optimizer is built as without it: plain DP over every rank, or under
// TP over the ranks holding the same slices (dp_group).
absl::Status SplitContextParallel(const StageOptions& stage, int rank, int world_size,
                                  const dist::GlooGroupOptions& gloo, ModelSet* models) {
  ModelSet& s = *models;
  if (s.device_type != c10::DeviceType::CPU) {
    return absl::UnimplementedError("experiment.learner.cp > 1 runs on the CPU so far");
  }
  const int tp = stage.learner.tp, cp = stage.learner.cp;
  const int t = rank % tp, r = (rank / tp) % cp, replica = rank / (tp * cp), replicas = world_size / (tp * cp);
  RLMESH_RETURN_IF_ERROR(JoinSubgroup(s, absl::StrCat("cp", replica, ".", t), r, cp, gloo, &s.cp_group));
  RLMESH_RETURN_IF_ERROR(JoinSubgroup(s, absl::StrCat("cpdp", r, ".", t), replica, replicas, gloo, &s.cp_replicas));
  auto wrap = [&](const actor::Transformer& whole, TensorParallelModel* split) {
    return split != nullptr ? ContextParallelModel::WrapTensorParallel(*split, s.cp_group, s.logprob_chunk)
                            : ContextParallelModel::Wrap(whole, s.cp_group, s.logprob_chunk);
  };
  auto made = wrap(s.policy, s.tp_policy.get());
  if (!made.ok()) return PrefixStatus("experiment", made.status());
  s.cp_policy = *std::move(made);
  if (s.reference) {
    RLMESH_ASSIGN_OR_RETURN(s.cp_reference, wrap(s.reference, s.tp_reference.get()));
  }
  if (s.teacher) {
    // Whole on every rank (under TP too), its rows split as the policy's.
    auto teacher = ContextParallelModel::Wrap(s.teacher, s.cp_group, s.logprob_chunk);
    if (!teacher.ok()) return PrefixStatus(TeacherField(stage), teacher.status());
    s.cp_teacher = *std::move(teacher);
  }
  return absl::OkStatus();
}

// learner.pp > 1: this replica's pipeline and the replicas holding the same
// stage (rank r is tensor-parallel slice r % tp of stage (r / tp) % pp of
// replica r / (pp x tp); the same join order everywhere), the policy and
// the reference cut into this rank's stage (and slice), and DataParallel
// over the replicas holding the same stage and slice.
absl::Status SplitPolicyPipeline(const StageOptions& stage, int rank, int world_size,
                                 const dist::GlooGroupOptions& gloo, ModelSet* models) {
  ModelSet& s = *models;
  if (s.device_type != c10::DeviceType::CPU) {
    return absl::UnimplementedError("experiment.learner.pp > 1 runs on the CPU so far");
  }
  const int pp = stage.learner.pp, tp = stage.learner.tp;
  const int t = rank % tp, st = (rank / tp) % pp, replica = rank / (pp * tp), replicas = world_size / (pp * tp);
  RLMESH_RETURN_IF_ERROR(JoinSubgroup(s, absl::StrCat("pptp", replica, ".", st), t, tp, gloo, &s.tp_group));
  RLMESH_RETURN_IF_ERROR(JoinSubgroup(s, absl::StrCat("pp", replica, ".", t), st, pp, gloo, &s.pp_group));
  RLMESH_RETURN_IF_ERROR(JoinSubgroup(s, absl::StrCat("ppdp", st, ".", t), replica, replicas, gloo, &s.dp_group));
  PipelineOptions po;
  po.tensor_parallel = s.tp_group;
  po.stage_layers = stage.learner.pp_layers;
  po.virtual_stages = stage.learner.pp_virtual_stages;
  po.logprob_chunk = s.logprob_chunk;
  po.optimizer.adamw = stage.optimizer().adamw;
  po.optimizer.grad_clip = std::max(0.0, stage.optimizer().grad_clip);
  po.optimizer.zero1 = stage.learner.zero1;
  po.data_parallel = s.dp_group;
  po.activation_checkpointing = stage.learner.gradient_checkpointing;
  {
    std::lock_guard<std::mutex> lock(InitMutex());
    auto made = PipelineModel::Create(s.policy->config(), s.pp_group, po);
    if (!made.ok()) return PrefixStatus(tp > 1 ? "experiment.learner.tp" : "experiment", made.status());
    s.pp_policy = *std::move(made);
    if (s.reference) {
      po.trainable = false;
      RLMESH_ASSIGN_OR_RETURN(s.pp_reference, PipelineModel::Create(s.reference->config(), s.pp_group, po));
    }
  }
  return CatchAll("split the policy", [&]() -> absl::Status {
    RLMESH_RETURN_IF_ERROR(BroadcastPolicy(&s));
    RLMESH_RETURN_IF_ERROR(s.pp_policy->LoadFromFull(s.policy->NamedParameters()));
    if (s.pp_reference) {
      RLMESH_RETURN_IF_ERROR(s.pp_reference->LoadFromFull(s.reference->NamedParameters()));
      DropParameterData(s.reference);
    }
    if (rank != 0) DropParameterData(s.policy);
    return absl::OkStatus();
  });
}

// learner.zero: 3 (with learner.tp > 1: ZeRO-3 over the replicas of each
// tensor-parallel rank's slices) for the policy or, `critic`, the critic.
absl::StatusOr<std::unique_ptr<FullyShardedModel>> CreateSharded(const ModelSet& s, const StageOptions& stage,
                                                                 const actor::ModelConfig& config,
                                                                 const OptimizerOptions& o) {
  FullyShardedOptions fo;
  fo.optimizer.adamw = o.adamw;
  fo.optimizer.grad_clip = std::max(0.0, o.grad_clip);
  fo.tensor_parallel = s.tp_group;
  std::lock_guard<std::mutex> lock(InitMutex());
  auto made = FullyShardedModel::Create(config, stage.learner.tp > 1 ? s.dp_group : s.group, fo);
  if (!made.ok() && stage.learner.tp > 1) return PrefixStatus("experiment.learner.tp", made.status());
  return made;
}

// learner.zero: 3: the broadcast policy cut into this rank's shards; ranks
// other than 0 drop the policy's parameter data.
absl::Status ShardPolicy(const StageOptions& stage, int rank, int world_size, const dist::GlooGroupOptions& gloo,
                         ModelSet* models) {
  ModelSet& s = *models;
  if (s.device_type != c10::DeviceType::CPU) {
    return absl::UnimplementedError(
        "experiment.learner.zero: 3 runs on the CPU so far (learner/fully_sharded builds its shards on the host)");
  }
  if (stage.learner.tp > 1) RLMESH_RETURN_IF_ERROR(JoinTensorParallelGroups(stage, rank, world_size, gloo, &s));
  RLMESH_ASSIGN_OR_RETURN(s.sharded, CreateSharded(s, stage, s.policy->config(), stage.optimizer()));
  return CatchAll("shard the policy", [&]() -> absl::Status {
    RLMESH_RETURN_IF_ERROR(BroadcastPolicy(&s));
    RLMESH_RETURN_IF_ERROR(s.sharded->LoadFromFull(s.policy->NamedParameters()));
    // With weight sync in pieces each rank keeps its slice, and none the
    // whole policy.
    RLMESH_RETURN_IF_ERROR(s.CutSyncSlices(s.policy->NamedParameters()));
    if (rank != 0 || s.whole_on_demand) DropParameterData(s.policy);
    return absl::OkStatus();
  });
}

// Plain DP (or ZeRO-1) over the replicas (dp_group) for a tensor-parallel
// model's trained slices, the gradient norm summed over tp_group.
absl::StatusOr<std::unique_ptr<DataParallel>> ReplicaOptimizer(const ModelSet& s, const TensorParallelModel& model,
                                                               const OptimizerOptions& o, bool zero1) {
  DataParallelOptions dpo;
  dpo.adamw = o.adamw;
  dpo.grad_clip = std::max(0.0, o.grad_clip);
  dpo.norm_groups = {s.tp_group};
  dpo.norm_weights = model.NormWeights();
  dpo.zero1 = zero1;
  return DataParallel::Create(s.dp_group, model.TrainedParameters(), dpo);
}

// Rank 0's critic weights to every rank (over the whole group).
absl::Status BroadcastCritic(ModelSet* models) {
  ModelSet& s = *models;
  if (!s.group) return absl::OkStatus();
  at::NoGradGuard no_grad;
  auto named = s.critic->NamedParameters();
  return dist::Collective("broadcast of the critic", [&] {
    for (auto& [name, t] : named) {
      std::vector<at::Tensor> v = {t};
      s.group->broadcast(v)->wait();
    }
  });
}

// learner.zero: 3 with a critic (PPO): rank 0's critic broadcast and cut
// into this rank's shards, like the policy (its lm_head frozen); every rank
// drops the critic's parameter data (a checkpoint gathers it on rank 0).
absl::Status ShardCritic(const StageOptions& stage, ModelSet* models) {
  ModelSet& s = *models;
  RLMESH_ASSIGN_OR_RETURN(s.sharded_critic, CreateSharded(s, stage, s.critic->config(), stage.rl.critic_optimizer));
  return CatchAll("shard the critic", [&]() -> absl::Status {
    RLMESH_RETURN_IF_ERROR(BroadcastCritic(&s));
    RLMESH_RETURN_IF_ERROR(s.sharded_critic->LoadFromFull(s.critic->NamedParameters()));
    DropParameterData(s.critic);
    return absl::OkStatus();
  });
}

// learner.tp > 1 with a critic (PPO): rank 0's critic broadcast and split
// over this replica's tensor-parallel group like the policy (its lm_head
// frozen), stepped by plain DP (or ZeRO-1) over the replicas.
absl::Status SplitCriticTensorParallel(const StageOptions& stage, ModelSet* models) {
  ModelSet& s = *models;
  TensorParallelOptions to;
  to.sequence_parallel = stage.learner.sequence_parallel;
  to.activation_checkpointing = stage.learner.gradient_checkpointing;
  {
    std::lock_guard<std::mutex> lock(InitMutex());
    auto made = TensorParallelModel::Create(s.critic->config(), s.tp_group, to);
    if (!made.ok()) return PrefixStatus("experiment.learner.tp", made.status());
    s.tp_critic = *std::move(made);
  }
  RLMESH_RETURN_IF_ERROR(CatchAll("split the critic", [&]() -> absl::Status {
    RLMESH_RETURN_IF_ERROR(BroadcastCritic(&s));
    RLMESH_RETURN_IF_ERROR(s.tp_critic->LoadFromFull(s.critic->NamedParameters()));
    DropParameterData(s.critic);
    return absl::OkStatus();
  }));
  RLMESH_ASSIGN_OR_RETURN(s.critic_dp,
                          ReplicaOptimizer(s, *s.tp_critic, stage.rl.critic_optimizer, stage.learner.zero1));
  return absl::OkStatus();
}

// learner.tp > 1: the replica and tensor-parallel groups, the policy (and
// the reference) split over the latter, and plain DP over the replicas.
// Rank r is tensor-parallel rank r % tp of replica r / tp.
absl::Status SplitPolicyTensorParallel(const StageOptions& stage, int rank, int world_size,
                                       const dist::GlooGroupOptions& gloo, ModelSet* models) {
  ModelSet& s = *models;
  if (s.device_type != c10::DeviceType::CPU) {
    return absl::UnimplementedError("experiment.learner.tp > 1 runs on the CPU so far");
  }
  RLMESH_RETURN_IF_ERROR(JoinTensorParallelGroups(stage, rank, world_size, gloo, &s));
  TensorParallelOptions to;
  to.sequence_parallel = stage.learner.sequence_parallel;
  to.activation_checkpointing = stage.learner.gradient_checkpointing;
  {
    std::lock_guard<std::mutex> lock(InitMutex());
    auto made = TensorParallelModel::Create(s.policy->config(), s.tp_group, to);
    if (!made.ok()) return PrefixStatus("experiment.learner.tp", made.status());
    s.tp_policy = *std::move(made);
    if (s.reference) {
      RLMESH_ASSIGN_OR_RETURN(s.tp_reference, TensorParallelModel::Create(s.reference->config(), s.tp_group, to));
    }
  }
  RLMESH_RETURN_IF_ERROR(CatchAll("split the policy", [&]() -> absl::Status {
    RLMESH_RETURN_IF_ERROR(BroadcastPolicy(&s));
    RLMESH_RETURN_IF_ERROR(s.tp_policy->LoadFromFull(s.policy->NamedParameters()));
    if (s.tp_reference) {
      RLMESH_RETURN_IF_ERROR(s.tp_reference->LoadFromFull(s.reference->NamedParameters()));
      for (at::Tensor& p : s.tp_reference->Parameters()) p.set_requires_grad(false);
      DropParameterData(s.reference);
    }
    if (rank != 0 || s.whole_on_demand) DropParameterData(s.policy);
    return absl::OkStatus();
  }));
  RLMESH_ASSIGN_OR_RETURN(s.dp, ReplicaOptimizer(s, *s.tp_policy, stage.optimizer(), stage.learner.zero1));
  return absl::OkStatus();
}

// learner.ep > 1: the policy's routed experts spread over groups of ep
// ranks (rank r is rank r % ep of group r / ep; with several groups, the
// ranks r % ep of every group share experts: expert data parallelism), the
// rest replicated; the reference, when there is one, stays whole on every
// rank (frozen: its passes need no exchange).
absl::Status SplitPolicyExpertParallel(const StageOptions& stage, int rank, int world_size,
                                       const dist::GlooGroupOptions& gloo, ModelSet* models) {
  ModelSet& s = *models;
  if (s.device_type != c10::DeviceType::CPU) {
    return absl::UnimplementedError("experiment.learner.ep > 1 runs on the CPU so far");
  }
  const int ep = stage.learner.ep, groups = world_size / ep;
  ExpertParallelOptions eo;
  eo.adamw = stage.optimizer().adamw;
  eo.grad_clip = std::max(0.0, stage.optimizer().grad_clip);
  c10::intrusive_ptr<c10d::Backend> ep_group = s.group;
  if (groups > 1) {
    // The same order on every rank: its expert-parallel group, then its
    // expert-data-parallel group.
    RLMESH_ASSIGN_OR_RETURN(ep_group, dist::CreateGlooGroup(dist::WithPrefix(s.store, absl::StrCat("ep", rank / ep)),
                                                            rank % ep, ep, gloo));
    RLMESH_ASSIGN_OR_RETURN(eo.data_group,
                            dist::CreateGlooGroup(dist::WithPrefix(s.store, absl::StrCat("edp", rank % ep)),
                                                  rank / ep, groups, gloo));
  }
  {
    std::lock_guard<std::mutex> lock(InitMutex());
    auto made = ExpertParallelModel::Create(s.policy->config(), ep_group, eo);
    if (!made.ok()) return PrefixStatus("experiment.learner.ep", made.status());
    s.ep_policy = *std::move(made);
  }
  return CatchAll("split the policy", [&]() -> absl::Status {
    RLMESH_RETURN_IF_ERROR(BroadcastPolicy(&s));
    RLMESH_RETURN_IF_ERROR(s.ep_policy->LoadFromFull(s.policy->NamedParameters()));
    if (rank != 0) DropParameterData(s.policy);
    return absl::OkStatus();
  });
}

}  // namespace

// Long because: builds every model of a stage (policy, reference, critic, reward model, teacher)
// for whichever of plain DP, ZeRO-1/3, TP and EP is on, in the order their process groups and
// broadcasts require.
absl::Status BuildTrainingModels(const ExperimentConfig& exp, const StageOptions& stage,
                                 const actor::ModelConfig& cfg, const std::string& store_address,
                                 const std::string& store_prefix, int rank,
                                 int world_size, const dist::GlooGroupOptions& gloo, int64_t store_timeout_ms,
                                 ModelSet* models) {
  ModelSet& s = *models;
  const std::string device = exp.model().device().empty() ? "cpu" : exp.model().device();
  const std::optional<actor::LoraSpec> lora = StageLora(exp, stage);
  if (lora && (stage.learner.zero3 || stage.learner.tp > 1 || stage.learner.ep > 1 || stage.learner.pp > 1 ||
               stage.learner.cp > 1)) {
    return absl::InvalidArgumentError(
        "experiment.model.lora: runs with plain data parallelism and learner.zero: 1 only");
  }
  RLMESH_RETURN_IF_ERROR(CatchAll("build reference/critic", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    auto copy_from_policy = [&](actor::Transformer& dst) {
      std::map<std::string, at::Tensor> src;
      for (auto& [name, t] : s.policy->NamedParameters()) src[name] = t;
      for (auto& [name, t] : dst->NamedParameters()) {
        auto it = src.find(name);
        if (it != src.end()) t.copy_(it->second);
      }
    };
    std::lock_guard<std::mutex> lock(InitMutex());
    const bool wants_reference = (stage.is_rl() && stage.rl.kl_coef > 0) || stage.kind == StageKind::kDpo;
    if (lora) {
      // Adapters on the frozen base (seeded alike on every rank; rank 0's
      // are broadcast below anyway). The base is the stage's initial
      // policy, so it is also the reference.
      s.lora = true;
      for (auto& [name, p] : s.policy->NamedParameters()) p.set_requires_grad(false);
      at::manual_seed(Mix(exp.seed(), 0x10a));
      RLMESH_RETURN_IF_ERROR(PrefixStatus("experiment.model.lora", actor::AttachLora(s.policy, *lora)));
      if (wants_reference) {
        s.reference = s.policy;
        s.reference_is_base = true;
      }
    } else if (wants_reference) {
      // The frozen reference is the stage's initial policy.
      s.reference = actor::Transformer(cfg);
      s.reference->to(c10::Device(device));
      copy_from_policy(s.reference);
      for (auto& p : s.reference->parameters()) p.set_requires_grad(false);
      s.reference->eval();
    }
    if (stage.is_rl() && stage.rl.distill.on()) {
      RLMESH_ASSIGN_OR_RETURN(s.teacher, LoadTeacher(stage, cfg, device));
    }
    if (stage.kind == StageKind::kPpo) {
      actor::ModelConfig ccfg = cfg;
      ccfg.value_head = true;
      at::manual_seed(Mix(exp.seed(), 0xc417));
      s.critic = actor::Transformer(ccfg);
      s.critic->to(c10::Device(device));
      copy_from_policy(s.critic);
    }
    return absl::OkStatus();
  }));

  // The process group and the optimizers.
  const bool on_gpu = s.device_type != c10::DeviceType::CPU;
  if (world_size > 1 && on_gpu) {
    // Data parallelism (plain or ZeRO-1) runs over NCCL on GPUs; the model
    // splits build their shards, buffers and subgroups on the host (Gloo).
    const char* split = stage.learner.zero3    ? "learner.zero: 3"
                        : stage.learner.tp > 1 ? "learner.tp > 1"
                        : stage.learner.ep > 1 ? "learner.ep > 1"
                        : stage.learner.pp > 1 ? "learner.pp > 1"
                        : stage.learner.cp > 1 ? "learner.cp > 1"
                                               : nullptr;
    if (split != nullptr) {
      return absl::UnimplementedError(absl::StrCat("experiment.", split, " on ", device,
                                                   ": runs on the CPU so far (its shards and groups are built "
                                                   "on the host); GPUs take plain data parallelism or "
                                                   "learner.zero: 1"));
    }
  }
  if (world_size > 1) {
    const std::string& addr = store_address;
    c10::intrusive_ptr<c10d::Store> store;
    if (absl::StartsWith(addr, "file:")) {
      auto file = dist::MakeFileStore(addr.substr(5), world_size);
      if (!file.ok()) return PrefixStatus("store_address", file.status());
      store = *file;
    } else {
      // A store hosted by another process (Learner.HostStore on learner 0):
      // every rank connects as a client, from any host.
      const size_t colon = addr.rfind(':');
      int port = 0;
      if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(addr.substr(colon + 1), &port) ||
          port <= 0 || port > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat("store_address: \"", addr, "\" is not file:/path or host:port"));
      }
      auto tcp = dist::MakeTcpStore(addr.substr(0, colon), port, /*is_server=*/false, world_size, store_timeout_ms);
      if (!tcp.ok()) return PrefixStatus("store_address", tcp.status());
      store = *tcp;
    }
    s.store = dist::WithPrefix(store, store_prefix);
    // One group for the shards: NCCL on GPUs (one per rank), Gloo on the CPU.
    auto group = on_gpu ? dist::CreateNcclGroup(s.store, rank, world_size, gloo.timeout_ms)
                        : dist::CreateGlooGroup(s.store, rank, world_size, gloo);
    if (!group.ok()) return PrefixStatus(absl::StrCat("learner shard ", rank, " on ", device), group.status());
    s.group = *group;
  }
  auto make_dp = [&](actor::Transformer& model, const OptimizerOptions& o,
                     bool skip_lm_head) -> absl::StatusOr<std::unique_ptr<DataParallel>> {
    std::vector<at::Tensor> params;
    // A LoRA policy's optimizer holds its adapters alone.
    const bool adapters = s.lora && model.get() == s.policy.get();
    for (auto& [name, t] : adapters ? model->AdapterParameters() : model->NamedParameters()) {
      if (skip_lm_head && name == "lm_head.weight") continue;
      params.push_back(t);
    }
    DataParallelOptions dpo;
    dpo.zero1 = stage.learner.zero1;
    dpo.adamw = o.adamw;
    dpo.grad_clip = std::max(0.0, o.grad_clip);
    return DataParallel::Create(s.group, std::move(params), dpo);
  };
  s.zero1 = stage.learner.zero1;
  // A reward model is never synced to the rollout: under ZeRO-3 or TP it is
  // gathered only for checkpoints.
  const bool reward_model = stage.kind == StageKind::kRewardModel;
  const bool pieces = weight_sync::ConfiguredWeightPieces(exp, world_size) > 1;
  // Under a pipeline (with TP or not) rank 0 gathers and keeps the whole
  // policy.
  s.whole_on_demand =
      ((stage.learner.tp > 1 && stage.learner.pp == 1) || stage.learner.zero3) && (pieces || reward_model);
  s.zero3_sync_slices = stage.learner.zero3 && pieces && !reward_model;
  if (stage.learner.zero3) {
    RLMESH_RETURN_IF_ERROR(ShardPolicy(stage, rank, world_size, gloo, &s));
  } else if (stage.learner.pp > 1) {
    RLMESH_RETURN_IF_ERROR(SplitPolicyPipeline(stage, rank, world_size, gloo, &s));
  } else if (stage.learner.tp > 1) {
    RLMESH_RETURN_IF_ERROR(SplitPolicyTensorParallel(stage, rank, world_size, gloo, &s));
    if (stage.learner.cp > 1) RLMESH_RETURN_IF_ERROR(SplitContextParallel(stage, rank, world_size, gloo, &s));
  } else if (stage.learner.ep > 1) {
    RLMESH_RETURN_IF_ERROR(SplitPolicyExpertParallel(stage, rank, world_size, gloo, &s));
  } else {
    // A reward model never uses its lm_head; keep it out of the optimizer.
    RLMESH_ASSIGN_OR_RETURN(s.dp, make_dp(s.policy, stage.optimizer(), stage.kind == StageKind::kRewardModel));
    RLMESH_RETURN_IF_ERROR(s.dp->BroadcastParameters());
    if (stage.learner.cp > 1) RLMESH_RETURN_IF_ERROR(SplitContextParallel(stage, rank, world_size, gloo, &s));
  }
  if (s.critic) {
    // Its lm_head is never used and stays out of the optimizer.
    s.critic_shapes.clear();
    for (auto& [name, t] : s.critic->NamedParameters()) {
      if (name != "lm_head.weight") s.critic_shapes.emplace_back(name, t.sizes().vec());
    }
  }
  if (s.critic && stage.learner.zero3) {
    RLMESH_RETURN_IF_ERROR(ShardCritic(stage, &s));
  } else if (s.critic && stage.learner.tp > 1) {
    RLMESH_RETURN_IF_ERROR(SplitCriticTensorParallel(stage, &s));
  } else if (s.critic) {
    // The critic's lm_head is never used; keep it out of the optimizer.
    RLMESH_ASSIGN_OR_RETURN(s.critic_dp, make_dp(s.critic, stage.rl.critic_optimizer, true));
    RLMESH_RETURN_IF_ERROR(s.critic_dp->BroadcastParameters());
  }
  if (stage.learner.gradient_checkpointing && !stage.learner.zero3 && stage.learner.tp == 1) {
    // ZeRO-3's units are recomputed in the backward pass already; the
    // tensor-parallel models took the option when they were split; EP
    // needs MoE layers.
    if (cfg.NumMoeLayers() > 0) {
      return absl::UnimplementedError(absl::StrCat(
          "experiment.learner.gradient_checkpointing: not built for MoE policies (the policy has ",
          cfg.NumMoeLayers(), " MoE layers)"));
    }
    s.policy->set_activation_checkpointing(true);
    if (s.critic) s.critic->set_activation_checkpointing(true);
  }
  if (s.reference && !s.PolicySplit() && !s.reference_is_base) {
    // Every rank's reference equals its (broadcast) initial policy (under
    // ZeRO-3, TP and EP, BroadcastPolicy copied it before the split).
    RLMESH_RETURN_IF_ERROR(CatchAll("reference", [&]() -> absl::Status {
      at::NoGradGuard no_grad;
      auto src = s.policy->NamedParameters();
      auto dst = s.reference->NamedParameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
      return absl::OkStatus();
    }));
  }

  return absl::OkStatus();
}

}  // namespace rlmesh::learner
