#include "learner/fully_sharded.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actor/attention_inputs.h"
#include "actor/autocast.h"
#include "common/status_macros.h"
#include "dist/collective.h"
#include "parallel/tensor_parallel.h"
#include "parallel/token_inputs.h"

namespace rlmesh::learner {

using parallel::CopyToTensorParallel;
using parallel::ReduceFromTensorParallel;
using parallel::TensorParallelGradientIsPartial;
using parallel::TensorParallelLayer;
using parallel::TensorParallelShardConfig;
using parallel::TensorParallelSplitDim;
using parallel::ValidateTensorParallel;
using parallel::ValidateTokenInputs;
using parallel::VocabParallelLogProbs;
using parallel::VocabParallelLookup;

struct FullyShardedModel::Unit {
  enum Kind { kEmbedding, kLayer, kHead };
  Kind kind = kLayer;
  int64_t layer = -1;
  // The head of a model with tied embeddings also binds unit 0.
  bool tied = false;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;  // the module's; empty while unbound
  std::vector<std::vector<int64_t>> shapes;       // this rank's slices'
  std::vector<std::vector<int64_t>> full_shapes;  // the whole parameters'
  // Under tensor parallelism: the gradient is summed over its group first.
  std::vector<bool> partial;
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  int64_t padded = 0;  // numel rounded up to a multiple of the group size
  at::Tensor shard;    // [padded / size]: leaf, requires grad
};

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kNone = -1;
constexpr int64_t kTiedBit = 1 << 4;

// The placeholder for an absent tensor argument of UnitFunction.
at::Tensor Absent() { return at::empty({0}, at::kFloat); }

// `args` with the absent ones (bit k of `present` clear) undefined again.
std::vector<at::Tensor> Present(std::vector<at::Tensor> args, int64_t present) {
  for (size_t k = 0; k < args.size(); ++k) {
    if ((present & (int64_t{1} << k)) == 0) args[k] = at::Tensor();
  }
  return args;
}

// The `present` bits of in0..in3 (and the tied head's shard0).
int64_t PresentBits(const std::vector<at::Tensor>& in, bool tied) {
  int64_t bits = tied ? kTiedBit : 0;
  for (size_t k = 0; k < in.size(); ++k) {
    if (in[k].defined()) bits |= int64_t{1} << k;
  }
  return bits;
}

at::Tensor OrAbsent(const at::Tensor& t) { return t.defined() ? t : Absent(); }

FullyShardedModel* ModelOf(AutogradContext* ctx) {
  return reinterpret_cast<FullyShardedModel*>(ctx->saved_data["model"].toInt());
}

// One unit as an autograd node: forward gathers and runs the unit without
// gradient; backward gathers again, recomputes it with gradient from the
// saved inputs and returns the reduce-scattered parameter gradients as the
// shards' gradients. `shard0` is unit 0's shard for a tied head, else
// undefined; `in` are the unit's inputs (see FullyShardedModel::Compute).
struct UnitFunction : public torch::autograd::Function<UnitFunction> {
  // Autograd needs every tensor argument defined: an absent one is passed as
  // Absent() and `present` has bit k set when in_k is real (bit 4: shard0).
  static variable_list forward(AutogradContext* ctx, int64_t model, int64_t unit, int64_t present,
                               const at::Tensor& shard, const at::Tensor& shard0, const at::Tensor& in0,
                               const at::Tensor& in1, const at::Tensor& in2, const at::Tensor& in3) {
    const bool tied = (present & kTiedBit) != 0;
    ctx->saved_data["model"] = model;
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["present"] = present;
    ctx->saved_data["autocast"] = actor::AutocastState::Current(shard.device().type()).Encode();
    ctx->save_for_backward({in0, in1, in2, in3});
    auto* m = reinterpret_cast<FullyShardedModel*>(model);
    const size_t u = static_cast<size_t>(unit);
    at::Tensor full = m->AcquireFull(u, u + 1);
    m->Bind(u, full);
    if (tied) m->Bind(0, m->AcquireFull(0, static_cast<size_t>(kNone)));
    std::vector<at::Tensor> out = m->Compute(u, Present({in0, in1, in2, in3}, present));
    m->Unbind(u);
    if (tied) m->Unbind(0);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    FullyShardedModel* m = ModelOf(ctx);
    const size_t u = static_cast<size_t>(ctx->saved_data["unit"].toInt());
    const int64_t present = ctx->saved_data["present"].toInt();
    const bool tied = (present & kTiedBit) != 0;
    variable_list saved = Present(ctx->get_saved_variables(), present);
    at::Tensor full = m->AcquireFull(u, u > 0 ? u - 1 : static_cast<size_t>(kNone));
    m->Bind(u, full);
    if (tied) m->Bind(0, m->AcquireFull(0, static_cast<size_t>(kNone)));
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> wrt;
    std::vector<int> wrt_input;  // which input each of wrt's first entries is
    {
      at::AutoGradMode grad(true);
      for (size_t k = 0; k < saved.size(); ++k) {
        at::Tensor x = saved[k];
        // needs_input_grad counts tensor arguments only: shard, shard0, in0..in3.
        if (x.defined() && x.is_floating_point() && ctx->needs_input_grad(2 + k)) {
          x = x.detach().requires_grad_(true);
          wrt.push_back(x);
          wrt_input.push_back(static_cast<int>(k));
        }
        inputs.push_back(x);
      }
      const size_t n_inputs = wrt.size();
      std::vector<at::Tensor> params = m->UnitParams(u);
      wrt.insert(wrt.end(), params.begin(), params.end());
      std::vector<at::Tensor> params0;
      if (tied) {
        params0 = m->UnitParams(0);
        wrt.insert(wrt.end(), params0.begin(), params0.end());
      }
      std::vector<at::Tensor> out;
      {
        // The recomputation runs in the dtypes of the forward (bf16
        // autocast); the backward through it, as any, outside autocast.
        actor::AutocastScope autocast(full.device().type(),
                                      actor::AutocastState::Decode(ctx->saved_data["autocast"].toInt()));
        out = m->Compute(u, inputs);
      }
      std::vector<at::Tensor> grads_of_out;
      for (size_t i = 0; i < out.size(); ++i) {
        grads_of_out.push_back(i < grad_out.size() && grad_out[i].defined() ? grad_out[i] : at::zeros_like(out[i]));
      }
      variable_list grads = torch::autograd::grad(out, wrt, grads_of_out, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
      m->Unbind(u);
      if (tied) m->Unbind(0);
      // One gradient per argument: model, unit, present, shard, shard0, in0..in3.
      variable_list result(9);
      for (size_t i = 0; i < n_inputs; ++i) result[5 + wrt_input[i]] = grads[i];
      std::vector<at::Tensor> unit_grads(grads.begin() + n_inputs, grads.begin() + n_inputs + params.size());
      result[3] = m->ReduceScatterGrads(u, unit_grads);
      if (tied) {
        std::vector<at::Tensor> grads0(grads.begin() + n_inputs + params.size(), grads.end());
        result[4] = m->ReduceScatterGrads(0, grads0);
      }
      return result;
    }
  }
};

// Runs unit `u` of `model` as an autograd node; `shard0` is unit 0's shard
// for a tied head (else undefined), `in` the unit's inputs (undefined =
// absent).
variable_list ApplyUnit(FullyShardedModel* model, size_t u, const at::Tensor& shard, const at::Tensor& shard0,
                        std::vector<at::Tensor> in) {
  in.resize(4);
  const int64_t present = PresentBits(in, shard0.defined());
  return UnitFunction::apply(reinterpret_cast<int64_t>(model), static_cast<int64_t>(u), present, shard,
                             OrAbsent(shard0), OrAbsent(in[0]), OrAbsent(in[1]), OrAbsent(in[2]),
                             OrAbsent(in[3]));
}

}  // namespace

absl::Status ValidateFullySharded(const actor::ModelConfig& c) {
  RLMESH_RETURN_IF_ERROR(c.Validate());
  if (c.IsMoeArch()) {
    return absl::UnimplementedError(absl::StrCat(
        "model.arch ", c.arch,
        ": fully sharded MoE layers are not built (the router's auxiliary loss and routing replay do not pass "
        "through the units)"));
  }
  return absl::OkStatus();
}

FullyShardedModel::~FullyShardedModel() = default;

// Long because: one pass over the units (collect them, check the parameter order, shard each),
// commented step by step in place.
absl::StatusOr<std::unique_ptr<FullyShardedModel>> FullyShardedModel::Create(
    const actor::ModelConfig& config, c10::intrusive_ptr<c10d::Backend> group, const FullyShardedOptions& options) {
  RLMESH_RETURN_IF_ERROR(ValidateFullySharded(config));
  if (options.logprob_chunk <= 0) return absl::InvalidArgumentError("logprob_chunk: must be > 0");
  if (options.optimizer.zero1 || !options.optimizer.norm_groups.empty() || !options.optimizer.norm_weights.empty() ||
      !options.optimizer.norm_ranges.empty()) {
    return absl::InvalidArgumentError(
        "optimizer: zero1, norm_groups and norm weights do not apply to fully sharded parameters");
  }
  const int tp = options.tensor_parallel ? options.tensor_parallel->getSize() : 1;
  if (tp > 1) RLMESH_RETURN_IF_ERROR(ValidateTensorParallel(config, tp));
  std::unique_ptr<FullyShardedModel> m(new FullyShardedModel());
  m->config_ = config;
  m->options_ = options;
  m->group_ = group;
  m->size_ = group ? group->getSize() : 1;
  m->rank_ = group ? group->getRank() : 0;
  if (tp > 1) {
    m->tp_group_ = options.tensor_parallel;
    m->tp_size_ = tp;
    m->tp_rank_ = options.tensor_parallel->getRank();
  }
  try {
    m->model_ = actor::Transformer(tp > 1 ? TensorParallelShardConfig(config, tp) : config);
    m->rope_ = actor::ComputeRope(config);
    // Units in execution order, parameters by Hugging Face name.
    const auto named = m->model_->NamedParameters();
    auto unit_of = [&](const std::string& name) -> std::pair<Unit::Kind, int64_t> {
      if (name == "model.embed_tokens.weight") return {Unit::kEmbedding, -1};
      if (absl::StartsWith(name, "model.layers.")) {
        return {Unit::kLayer, std::stoll(name.substr(13, name.find('.', 13) - 13))};
      }
      return {Unit::kHead, -1};  // model.norm.weight, lm_head.weight
    };
    m->units_.resize(config.num_layers + 2);
    for (size_t u = 0; u < m->units_.size(); ++u) {
      m->units_[u] = std::make_unique<Unit>();
      Unit& unit = *m->units_[u];
      unit.kind = u == 0 ? Unit::kEmbedding : u == m->units_.size() - 1 ? Unit::kHead : Unit::kLayer;
      unit.layer = unit.kind == Unit::kLayer ? static_cast<int64_t>(u) - 1 : -1;
      unit.tied = unit.kind == Unit::kHead && config.tie_embeddings;
    }
    // A value-head model (a reward model, a critic) never uses its lm_head:
    // it is sharded like a unit but frozen, out of the optimizer.
    const bool freeze_lm_head = config.value_head && !config.tie_embeddings;
    if (freeze_lm_head) m->frozen_ = std::make_unique<Unit>();
    auto frozen = [&](const std::string& name) { return freeze_lm_head && name == "lm_head.weight"; };
    for (const auto& [name, p] : named) {
      Unit* unit = frozen(name) ? m->frozen_.get() : nullptr;
      if (unit == nullptr) {
        auto [kind, layer] = unit_of(name);
        unit = m->units_[kind == Unit::kEmbedding ? 0 : kind == Unit::kLayer ? layer + 1 : m->units_.size() - 1].get();
      }
      std::vector<int64_t> full_shape = p.sizes().vec();
      const int dim = TensorParallelSplitDim(name);
      if (tp > 1 && dim >= 0) full_shape[dim] *= tp;
      unit->names.push_back(name);
      unit->params.push_back(p);
      unit->shapes.push_back(p.sizes().vec());
      unit->full_shapes.push_back(std::move(full_shape));
      unit->partial.push_back(tp > 1 && TensorParallelGradientIsPartial(name, /*sequence_parallel=*/false));
      unit->offsets.push_back(unit->numel);
      unit->numel += p.numel();
    }
    // The units' parameters, in unit order, are the model's NamedParameters
    // in order, a frozen lm_head aside (VisitMoments' flat layout relies on
    // it: plain DP's, which leaves that lm_head out of the optimizer too).
    {
      size_t k = 0;
      for (const auto& unit : m->units_) {
        for (const std::string& name : unit->names) {
          if (k < named.size() && frozen(named[k].first)) ++k;
          if (k >= named.size() || named[k].first != name) {
            return absl::InternalError(absl::StrCat("fully sharded model: parameter ", name,
                                                    " is out of the model's order"));
          }
          ++k;
        }
      }
    }
    // Shard every unit: rank r keeps slice r of the zero-padded flat vector.
    at::NoGradGuard no_grad;
    auto shard = [&](Unit& unit, bool trained) {
      unit.padded = (unit.numel + m->size_ - 1) / m->size_ * m->size_;
      const int64_t len = unit.padded / m->size_;
      at::Tensor flat = at::zeros({unit.padded}, at::kFloat);
      for (size_t i = 0; i < unit.params.size(); ++i) {
        flat.narrow(0, unit.offsets[i], unit.params[i].numel()).copy_(unit.params[i].reshape({-1}));
      }
      unit.shard = flat.narrow(0, m->rank_ * len, len).clone().requires_grad_(trained);
    };
    for (auto& unit : m->units_) shard(*unit, /*trained=*/true);
    for (size_t u = 0; u < m->units_.size(); ++u) m->Unbind(u);
    if (m->frozen_) {
      shard(*m->frozen_, /*trained=*/false);
      for (at::Tensor& p : m->frozen_->params) p.set_data(at::empty({0}, p.options()));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("fully sharded model: ", e.what_without_backtrace()));
  }
  DataParallelOptions o = options.optimizer;
  // Each rank's shards are its own part of the norm; under tensor
  // parallelism a replicated parameter's elements, held by every
  // tensor-parallel rank, count 1/tp each.
  o.norm_groups = {group, m->tp_group_};
  if (tp > 1) {
    for (const auto& unit : m->units_) {
      // The replicated parameters' elements that fall in this rank's shard.
      const int64_t len = unit->padded / m->size_, first = m->rank_ * len;
      std::vector<DataParallelOptions::NormRange> ranges;
      for (size_t i = 0; i < unit->names.size(); ++i) {
        if (TensorParallelSplitDim(unit->names[i]) >= 0) continue;
        const int64_t lo = std::max(unit->offsets[i], first);
        const int64_t hi = std::min(unit->offsets[i] + c10::multiply_integers(unit->shapes[i]), first + len);
        if (lo < hi) ranges.push_back({lo - first, hi - first, 1.0 / tp});
      }
      o.norm_ranges.push_back(std::move(ranges));
    }
  }
  RLMESH_ASSIGN_OR_RETURN(m->optimizer_, DataParallel::Create(nullptr, m->Shards(), o));
  return m;
}

void FullyShardedModel::Bind(size_t u, const at::Tensor& full) {
  Unit& unit = *units_[u];
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const int64_t n = c10::multiply_integers(unit.shapes[i]);
    unit.params[i].set_data(full.narrow(0, unit.offsets[i], n).view(unit.shapes[i]));
  }
}

void FullyShardedModel::Unbind(size_t u) {
  for (at::Tensor& p : units_[u]->params) p.set_data(at::empty({0}, p.options()));
}

std::vector<at::Tensor> FullyShardedModel::UnitParams(size_t u) const { return units_[u]->params; }

at::Tensor FullyShardedModel::AcquireFull(size_t u, size_t next) {
  at::Tensor full;
  auto it = prefetched_.find(u);
  if (it != prefetched_.end()) {
    it->second.first->wait();
    full = it->second.second;
    prefetched_.erase(it);
  } else if (size_ == 1) {
    full = units_[u]->shard.detach();
  } else {
    full = at::empty({units_[u]->padded}, at::kFloat);
    at::Tensor mine = units_[u]->shard.detach();
    group_->_allgather_base(full, mine)->wait();
  }
  if (options_.prefetch && size_ > 1 && next < units_.size() && prefetched_.count(next) == 0) Prefetch(next);
  return full;
}

void FullyShardedModel::Prefetch(size_t u) {
  at::Tensor full = at::empty({units_[u]->padded}, at::kFloat);
  at::Tensor mine = units_[u]->shard.detach();
  prefetched_[u] = {group_->_allgather_base(full, mine), full};
}

at::Tensor FullyShardedModel::ReduceScatterGrads(size_t u, const std::vector<at::Tensor>& grads) {
  const Unit& unit = *units_[u];
  at::Tensor flat = at::zeros({unit.padded}, at::kFloat);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    at::Tensor part = flat.narrow(0, unit.offsets[i], grads[i].numel());
    part.copy_(grads[i].reshape({-1}));
    // Each tensor-parallel rank saw only its heads' share of this gradient.
    if (unit.partial[i]) {
      std::vector<at::Tensor> v = {part};
      tp_group_->allreduce(v)->wait();
    }
  }
  // DataParallel's convention: local-mean gradients times the local weight,
  // summed over the ranks; Step divides by the global weight.
  flat.mul_(local_weight_);
  if (size_ == 1) return flat;
  at::Tensor mine = at::empty({unit.padded / size_}, at::kFloat);
  group_->_reduce_scatter_base(mine, flat)->wait();
  return mine;
}

std::vector<at::Tensor> FullyShardedModel::Compute(size_t u, const std::vector<at::Tensor>& in) {
  const Unit& unit = *units_[u];
  auto* backbone = model_->model.get();
  switch (unit.kind) {
    case Unit::kEmbedding:
      if (tp_group_) return {ReduceFromTensorParallel(VocabParallelLookup(*model_, in[0], tp_rank_), tp_group_.get())};
      return {backbone->embed_tokens(in[0])};
    case Unit::kLayer: {
      auto* layer = (*backbone->layers)[unit.layer]->as<actor::DecoderLayerImpl>();
      if (tp_group_) return {TensorParallelLayer(*layer, in[0], in[1], in[2], in[3], tp_group_.get())};
      return {layer->Forward(in[0], in[1], in[2], in[3], nullptr)};
    }
    case Unit::kHead: {
      if (head_values_) return {model_->ValuesFromHidden(backbone->norm(in[0]))};
      if (tp_group_) {
        // Vocabulary-parallel: this rank's [B,T,V/tp] logits, never the whole.
        auto out = VocabParallelLogProbs(CopyToTensorParallel(backbone->norm(in[0]), tp_group_.get()),
                                         model_->LmHeadWeight(), in[1], temperature_, tp_group_.get());
        return {out.logprobs, out.entropy};
      }
      auto out = actor::TokenLogProbsFromHidden(backbone->norm(in[0]), model_->LmHeadWeight(), in[1],
                                                logprob_chunk_, temperature_);
      TORCH_CHECK(out.ok(), out.status().ToString());
      return {out->logprobs, out->entropy};
    }
  }
  return {};
}

absl::StatusOr<actor::TokenLogProbsOutput> FullyShardedModel::TokenLogProbs(const at::Tensor& ids,
                                                                           const at::Tensor& positions,
                                                                           const at::Tensor& targets,
                                                                           double temperature,
                                                                           const at::Tensor& attention_mask,
                                                                           int64_t logprob_chunk) {
  RLMESH_RETURN_IF_ERROR(ValidateTokenInputs(ids, positions, targets, temperature, config_.vocab_size));
  if (logprob_chunk < 0) return absl::InvalidArgumentError("logprob_chunk: must be >= 0");
  if (frozen_) {
    return absl::FailedPreconditionError(
        "TokenLogProbs: a value-head model (reward model, critic) gives values; its lm_head is frozen and never "
        "gathered");
  }
  try {
    temperature_ = temperature;
    logprob_chunk_ = logprob_chunk > 0 ? logprob_chunk : options_.logprob_chunk;
    head_values_ = false;
    const size_t head = units_.size() - 1;
    at::Tensor h = Layers(ids, positions, attention_mask);
    variable_list out = ApplyUnit(this, head, units_[head]->shard,
                                  units_[head]->tied ? units_[0]->shard : at::Tensor(), {h, targets});
    return actor::TokenLogProbsOutput{out[0], out[1]};
  } catch (const std::exception& e) {
    prefetched_.clear();
    return absl::AbortedError(absl::StrCat("fully sharded log-probs failed: ", e.what()));
  }
}

absl::StatusOr<at::Tensor> FullyShardedModel::Values(const at::Tensor& ids, const at::Tensor& positions,
                                                     const at::Tensor& attention_mask) {
  if (!config_.value_head) {
    return absl::FailedPreconditionError("Values: the model has no value head (config.value_head=false)");
  }
  // The ids stand in for targets: only their shapes and range are checked.
  RLMESH_RETURN_IF_ERROR(ValidateTokenInputs(ids, positions, ids, 1.0, config_.vocab_size));
  try {
    head_values_ = true;
    const size_t head = units_.size() - 1;
    at::Tensor h = Layers(ids, positions, attention_mask);
    return ApplyUnit(this, head, units_[head]->shard, at::Tensor(), {h})[0];
  } catch (const std::exception& e) {
    prefetched_.clear();
    return absl::AbortedError(absl::StrCat("fully sharded values failed: ", e.what()));
  }
}

at::Tensor FullyShardedModel::Layers(const at::Tensor& ids, const at::Tensor& positions,
                                     const at::Tensor& attention_mask) {
  const size_t head = units_.size() - 1;
  at::Tensor h = ApplyUnit(this, 0, units_[0]->shard, at::Tensor(), {ids})[0];
  auto [cos, sin] = actor::RopeCosSin(config_, rope_, positions, h.scalar_type());
  at::Tensor mask = actor::AttentionMask4d(attention_mask, ids.size(1), h.device());
  for (size_t u = 1; u < head; ++u) h = ApplyUnit(this, u, units_[u]->shard, at::Tensor(), {h, cos, sin, mask})[0];
  return h;
}

void FullyShardedModel::ZeroGrad(double local_weight) {
  local_weight_ = local_weight;
  optimizer_->ZeroGrad();
}

absl::StatusOr<DataParallelStepStats> FullyShardedModel::Step(double lr) {
  double global = local_weight_;
  if (size_ > 1) {
    at::Tensor w = at::full({1}, local_weight_, at::TensorOptions().dtype(at::kDouble));
    RLMESH_RETURN_IF_ERROR(dist::Collective("global weight", [&] {
      std::vector<at::Tensor> v = {w};
      group_->allreduce(v)->wait();
    }));
    global = w.item<double>();
  }
  if (!(global > 0)) return absl::InvalidArgumentError("local_weight: the global weight over all ranks is 0");
  {
    at::NoGradGuard no_grad;
    for (const auto& unit : units_) {
      if (unit->shard.grad().defined()) unit->shard.mutable_grad().div_(global);
    }
  }
  RLMESH_ASSIGN_OR_RETURN(DataParallelStepStats stats, optimizer_->Step(1.0, lr));
  stats.global_weight = global;
  return stats;
}

std::vector<at::Tensor> FullyShardedModel::Shards() const {
  std::vector<at::Tensor> out;
  for (const auto& unit : units_) out.push_back(unit->shard);
  return out;
}

absl::Status FullyShardedModel::LoadOptimizerState(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                                                   int64_t steps) {
  return optimizer_->LoadOptimizerState(exp_avg, exp_avg_sq, steps);
}

absl::Status FullyShardedModel::VisitMoments(
    const std::function<absl::Status(int, const std::string&, const at::Tensor&)>& visit) {
  absl::Status first;
  for (int k = 0; k < 2; ++k) {
    const at::Tensor& flat = k == 0 ? optimizer_->exp_avg() : optimizer_->exp_avg_sq();
    std::vector<at::Tensor> per_shard;
    int64_t offset = 0;
    for (const auto& unit : units_) {
      per_shard.push_back(flat.narrow(0, offset, unit->shard.numel()));
      offset += unit->shard.numel();
    }
    // Both moments are gathered whatever a visit returns (every rank makes
    // the same collectives); the first error is returned.
    absl::Status s = VisitGathered(per_shard, /*with_frozen=*/false,
                                   [&](const std::string& name, const at::Tensor& full) {
                                     return first.ok() ? visit(k, name, full) : absl::OkStatus();
                                   });
    if (absl::IsAborted(s)) return s;
    if (first.ok()) first = s;
  }
  return first;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> FullyShardedModel::FullShapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& unit : units_) {
    for (size_t i = 0; i < unit->names.size(); ++i) out.emplace_back(unit->names[i], unit->full_shapes[i]);
  }
  if (frozen_) {
    for (size_t i = 0; i < frozen_->names.size(); ++i) out.emplace_back(frozen_->names[i], frozen_->full_shapes[i]);
  }
  return out;
}

absl::Status FullyShardedModel::LoadMoments(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                                            int64_t steps) {
  std::vector<at::Tensor> mine[2];
  const at::Tensor* full[2] = {&exp_avg, &exp_avg_sq};
  for (int k = 0; k < 2; ++k) {
    if (!full[k]->defined() || full[k]->dim() != 1 || full[k]->numel() != full_numel()) {
      return absl::InvalidArgumentError(absl::StrCat(k == 0 ? "exp_avg" : "exp_avg_sq", ": expected ",
                                                     full_numel(), " elements (the whole model's)"));
    }
    // Named tensors in unit order, which is the flat layout's order.
    Named named;
    int64_t offset = 0;
    for (const auto& unit : units_) {
      for (size_t i = 0; i < unit->names.size(); ++i) {
        const int64_t n = c10::multiply_integers(unit->full_shapes[i]);
        named.emplace_back(unit->names[i], full[k]->narrow(0, offset, n).view(unit->full_shapes[i]));
        offset += n;
      }
    }
    RLMESH_ASSIGN_OR_RETURN(mine[k], SliceOf(named));
  }
  return optimizer_->LoadOptimizerState(at::cat(mine[0]), at::cat(mine[1]), steps);
}

absl::Status FullyShardedModel::LoadMomentsFrom(const MomentsReader& read, int64_t steps) {
  if (tp_group_) {
    return absl::FailedPreconditionError(
        "LoadMomentsFrom: a tensor-parallel rank's slices are not ranges of the flat layout (use LoadMoments)");
  }
  std::vector<at::Tensor> mine[2];
  // Without TP a unit's parameters lie end to end in the flat layout, and
  // this rank's shard of the unit is one range of them (the padding past
  // the unit's end stays zero).
  int64_t unit_begin = 0;
  for (const auto& unit : units_) {
    const int64_t len = unit->padded / size_, lo = rank_ * len, hi = std::min(lo + len, unit->numel);
    for (int k = 0; k < 2; ++k) {
      at::Tensor shard = at::zeros({len}, at::kFloat);
      if (hi > lo) {
        RLMESH_ASSIGN_OR_RETURN(at::Tensor part, read(k, unit_begin + lo, hi - lo));
        if (!part.defined() || part.numel() != hi - lo) {
          return absl::InternalError(absl::StrCat("LoadMomentsFrom: a read of ", hi - lo, " elements gave ",
                                                  part.defined() ? part.numel() : 0));
        }
        shard.narrow(0, 0, hi - lo).copy_(part.reshape({-1}));
      }
      mine[k].push_back(std::move(shard));
    }
    unit_begin += unit->numel;
  }
  return optimizer_->LoadOptimizerState(at::cat(mine[0]), at::cat(mine[1]), steps);
}

int64_t FullyShardedModel::full_numel() const {
  int64_t n = 0;
  for (const auto& unit : units_) {
    for (const auto& shape : unit->full_shapes) n += c10::multiply_integers(shape);
  }
  return n;
}

at::Tensor FullyShardedModel::LocalOf(const std::string& name, const at::Tensor& full) const {
  const int dim = TensorParallelSplitDim(name);
  if (!tp_group_ || dim < 0) return full;
  const int64_t n = full.size(dim) / tp_size_;
  return full.narrow(dim, tp_rank_ * n, n);
}

at::Tensor FullyShardedModel::WholeOf(const std::string& name, const at::Tensor& local) {
  const int dim = TensorParallelSplitDim(name);
  if (!tp_group_ || dim < 0) return local;
  // Slices stacked along a new leading dimension, then laid side by side
  // along the split one.
  at::Tensor in = local.unsqueeze(0).contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] = tp_size_;
  at::Tensor stacked = at::empty(shape, in.options());
  tp_group_->_allgather_base(stacked, in)->wait();
  return at::cat(stacked.unbind(0), dim);
}

int64_t FullyShardedModel::shard_numel() const {
  int64_t n = frozen_ ? frozen_->shard.numel() : 0;
  for (const auto& unit : units_) n += unit->shard.numel();
  return n;
}

absl::StatusOr<at::Tensor> FullyShardedModel::SliceUnit(const Unit& unit,
                                                        const std::map<std::string, at::Tensor>& by_name) const {
  at::Tensor flat = at::zeros({unit.padded}, at::kFloat);
  for (size_t i = 0; i < unit.names.size(); ++i) {
    auto it = by_name.find(unit.names[i]);
    if (it == by_name.end()) return absl::InvalidArgumentError(absl::StrCat("parameter ", unit.names[i], ": missing"));
    if (!it->second.defined() || it->second.sizes().vec() != unit.full_shapes[i]) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", unit.names[i], ": expected shape ",
                                                     c10::str(at::IntArrayRef(unit.full_shapes[i])), ", got ",
                                                     it->second.defined() ? c10::str(it->second.sizes()) : "none"));
    }
    const at::Tensor local = LocalOf(unit.names[i], it->second.detach());
    flat.narrow(0, unit.offsets[i], local.numel()).copy_(local.reshape({-1}));
  }
  const int64_t len = unit.padded / size_;
  return flat.narrow(0, rank_ * len, len).clone();
}

absl::StatusOr<std::vector<at::Tensor>> FullyShardedModel::SliceOf(const Named& full) const {
  std::map<std::string, at::Tensor> by_name(full.begin(), full.end());
  std::vector<at::Tensor> out;
  for (const auto& unit : units_) {
    RLMESH_ASSIGN_OR_RETURN(at::Tensor shard, SliceUnit(*unit, by_name));
    out.push_back(std::move(shard));
  }
  return out;
}

absl::Status FullyShardedModel::LoadFromFull(const Named& full) {
  RLMESH_ASSIGN_OR_RETURN(std::vector<at::Tensor> shards, SliceOf(full));
  at::Tensor frozen;
  if (frozen_) {
    RLMESH_ASSIGN_OR_RETURN(frozen, SliceUnit(*frozen_, std::map<std::string, at::Tensor>(full.begin(), full.end())));
  }
  at::NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) units_[u]->shard.copy_(shards[u]);
  if (frozen_) frozen_->shard.copy_(frozen);
  return absl::OkStatus();
}

absl::StatusOr<FullyShardedModel::Named> FullyShardedModel::GatherFull() {
  Named out;
  RLMESH_RETURN_IF_ERROR(VisitFull([&](const std::string& name, const at::Tensor& full) {
    out.emplace_back(name, full.clone());
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<FullyShardedModel::Named> FullyShardedModel::GatherFullOf(const std::vector<at::Tensor>& shards) {
  Named out;
  RLMESH_RETURN_IF_ERROR(VisitGathered(shards, /*with_frozen=*/false,
                                       [&](const std::string& name, const at::Tensor& full) {
                                         out.emplace_back(name, full.clone());
                                         return absl::OkStatus();
                                       }));
  return out;
}

absl::Status FullyShardedModel::VisitFull(
    const std::function<absl::Status(const std::string&, const at::Tensor&)>& visit) {
  return VisitGathered(Shards(), /*with_frozen=*/true, visit);
}

absl::Status FullyShardedModel::VisitGathered(
    const std::vector<at::Tensor>& shards, bool with_frozen,
    const std::function<absl::Status(const std::string&, const at::Tensor&)>& visit) {
  if (shards.size() != units_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shards: ", shards.size(), " tensors for ", units_.size(), " units"));
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!shards[u].defined() || shards[u].numel() != units_[u]->shard.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards[", u, "]: expected ", units_[u]->shard.numel(), " elements"));
    }
  }
  std::vector<std::pair<const Unit*, at::Tensor>> visits;
  for (size_t u = 0; u < units_.size(); ++u) visits.emplace_back(units_[u].get(), shards[u]);
  if (with_frozen && frozen_) visits.emplace_back(frozen_.get(), frozen_->shard);
  at::NoGradGuard no_grad;
  absl::Status first;
  for (const auto& [unit, shard] : visits) {
    at::Tensor full;
    if (size_ == 1) {
      full = shard.detach().reshape({-1});
    } else {
      full = at::empty({unit->padded}, at::kFloat);
      at::Tensor mine = shard.detach().reshape({-1}).contiguous();
      RLMESH_RETURN_IF_ERROR(
          dist::Collective("fully sharded gather", [&] { group_->_allgather_base(full, mine)->wait(); }));
    }
    // Every rank makes every gather (a failed visit on one rank must not
    // leave the others waiting in the next one): the first error is kept
    // and returned after the last unit.
    for (size_t i = 0; i < unit->names.size(); ++i) {
      const int64_t n = c10::multiply_integers(unit->shapes[i]);
      at::Tensor whole = full.narrow(0, unit->offsets[i], n).view(unit->shapes[i]);
      if (tp_group_) {
        RLMESH_RETURN_IF_ERROR(
            dist::Collective("tensor-parallel gather", [&, &name = unit->names[i]] { whole = WholeOf(name, whole); }));
      }
      if (first.ok()) first = visit(unit->names[i], whole);
    }
  }
  return first;
}

}  // namespace rlmesh::learner
