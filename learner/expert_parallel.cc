#include "learner/expert_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "dist/collective.h"
#include "learner/tensor_checks.h"

namespace rlmesh::learner {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows of `x` in blocks of send[r] rows to rank r; returns the rows
// received, recv[r] from rank r, in rank order.
at::Tensor AllToAll(c10d::Backend* g, const at::Tensor& x, std::vector<int64_t> send, std::vector<int64_t> recv) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  at::Tensor out = at::empty(shape, x.options());
  at::Tensor in = x.contiguous();
  g->alltoall_base(out, in, recv, send)->wait();
  return out;
}

// The differentiable exchange of an MoE layer's rows. Forward: AllToAll
// with (send, recv). Backward: the reverse exchange of the gradient,
// multiplied by `before` ahead of it and by `after` behind it (the expert
// gradient scale; see expert_parallel.h).
struct ExchangeRows : public torch::autograd::Function<ExchangeRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group, std::vector<int64_t> send,
                            std::vector<int64_t> recv, double before, double after) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["before"] = before;
    ctx->saved_data["after"] = after;
    return AllToAll(reinterpret_cast<c10d::Backend*>(group), x, send, recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto* group = reinterpret_cast<c10d::Backend*>(ctx->saved_data["group"].toInt());
    const double before = ctx->saved_data["before"].toDouble(), after = ctx->saved_data["after"].toDouble();
    at::Tensor grad = before == 1.0 ? g[0] : g[0] * before;
    grad = AllToAll(group, grad, ctx->saved_data["recv"].toIntVector(), ctx->saved_data["send"].toIntVector());
    if (after != 1.0) grad = grad * after;
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// "model.layers.<l>.mlp.experts.<e>.<rest>" -> e, else -1.
int ExpertIndex(const std::string& name) {
  std::vector<std::string> parts = absl::StrSplit(name, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    int e = 0;
    if (parts[i] == "experts" && i > 0 && parts[i - 1] == "mlp" && absl::SimpleAtoi(parts[i + 1], &e)) return e;
  }
  return -1;
}

}  // namespace

int ExpertOf(const std::string& hf_name) { return ExpertIndex(hf_name); }

absl::Status ValidateExpertParallel(const actor::ModelConfig& c, int ep) {
  if (ep < 1) return absl::InvalidArgumentError(absl::StrCat("ep: must be >= 1, got ", ep));
  RLMESH_RETURN_IF_ERROR(c.Validate());
  if (!c.IsMoeArch() || c.NumMoeLayers() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.arch ", c.arch, ": expert parallelism needs MoE layers (qwen3_moe, qwen2_moe)"));
  }
  if (c.num_experts % ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.num_experts (", c.num_experts, ") is not divisible by ep (", ep, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ExpertParallelModel>> ExpertParallelModel::Create(
    const actor::ModelConfig& config, c10::intrusive_ptr<c10d::Backend> group, const ExpertParallelOptions& options) {
  const int size = group ? group->getSize() : 1;
  RLMESH_RETURN_IF_ERROR(ValidateExpertParallel(config, size));
  if (!(options.grad_clip >= 0)) return absl::InvalidArgumentError("grad_clip: must be >= 0");
  std::unique_ptr<ExpertParallelModel> m(new ExpertParallelModel());
  m->config_ = config;
  m->options_ = options;
  m->group_ = group;
  m->rank_ = group ? group->getRank() : 0;
  m->size_ = size;
  m->experts_per_rank_ = config.num_experts / size;
  try {
    m->model_ = actor::Transformer(config);
    at::NoGradGuard no_grad;
    // The other ranks' experts: names and config stay, data goes.
    for (auto& [name, p] : m->model_->NamedParameters()) {
      if (m->IsLocal(name)) {
        const bool expert = ExpertIndex(name) >= 0;
        (expert ? m->local_experts_ : m->replicated_).push_back(p);
        (expert ? m->local_expert_names_ : m->replicated_names_).push_back(name);
      } else {
        p.set_requires_grad(false);
        p.set_data(at::empty({0}, p.options()));
      }
    }
    if (size > 1) {
      ExpertParallelModel* self = m.get();
      for (const auto& module : *m->model_->model->layers) {
        auto* layer = module->as<actor::DecoderLayerImpl>();
        if (!layer->moe) continue;
        layer->moe->set_experts([self](actor::MoeImpl& moe, const at::Tensor& tokens, const at::Tensor& idx,
                                       const at::Tensor& weights) {
          return self->RunExperts(moe, tokens, idx, weights);
        });
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("expert-parallel model: ", e.what_without_backtrace()));
  }
  std::vector<at::Tensor> params = m->replicated_;
  params.insert(params.end(), m->local_experts_.begin(), m->local_experts_.end());
  DataParallelOptions o;
  o.adamw = options.adamw;
  o.grad_clip = 0;  // Step clips the whole model's norm first
  RLMESH_ASSIGN_OR_RETURN(m->adamw_, DataParallel::Create(nullptr, params, o));
  return m;
}

bool ExpertParallelModel::IsLocal(const std::string& hf_name) const {
  const int e = ExpertIndex(hf_name);
  return e < 0 || e / experts_per_rank_ == rank_;
}

absl::Status ExpertParallelModel::LoadFromFull(const Named& full) {
  const std::map<std::string, at::Tensor> by_name(full.begin(), full.end());
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : NamedParameters()) RLMESH_RETURN_IF_ERROR(internal::CopyNamed(by_name, name, p));
  return absl::OkStatus();
}

ExpertParallelModel::Named ExpertParallelModel::NamedParameters() const {
  Named out;
  for (auto& [name, p] : model_->NamedParameters()) {
    if (IsLocal(name)) out.emplace_back(name, p);
  }
  return out;
}

absl::StatusOr<ExpertParallelModel::Named> ExpertParallelModel::GatherFull() {
  Named out;
  // Every rank's experts, gathered one local-expert slot at a time: slot j
  // of rank r is expert r * experts_per_rank + j.
  std::map<std::string, at::Tensor> gathered;
  RLMESH_RETURN_IF_ERROR(dist::Collective("expert all-gather", [&] {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : model_->NamedParameters()) {
      const int e = ExpertIndex(name);
      if (e < 0 || size_ == 1 || e / experts_per_rank_ != rank_) continue;
      std::vector<at::Tensor> in = {p.detach().contiguous()};
      std::vector<std::vector<at::Tensor>> outs(1);
      for (int r = 0; r < size_; ++r) outs[0].push_back(at::empty_like(in[0]));
      group_->allgather(outs, in)->wait();
      const int64_t slot = e % experts_per_rank_;
      const std::string tail = name.substr(name.find(".experts.") + 9);
      const std::string head = name.substr(0, name.find(".experts.") + 9);
      const std::string rest = tail.substr(tail.find('.'));
      for (int r = 0; r < size_; ++r) {
        gathered[absl::StrCat(head, r * experts_per_rank_ + slot, rest)] = outs[0][r];
      }
    }
  }));
  for (auto& [name, p] : model_->NamedParameters()) {
    if (ExpertIndex(name) >= 0 && size_ > 1) {
      auto it = gathered.find(name);
      if (it == gathered.end()) return absl::InternalError(absl::StrCat(name, ": not gathered"));
      out.emplace_back(name, it->second);
    } else {
      out.emplace_back(name, p.detach().clone());
    }
  }
  return out;
}

at::Tensor ExpertParallelModel::RunExperts(actor::MoeImpl& moe, const at::Tensor& tokens, const at::Tensor& idx,
                                           const at::Tensor& weights) {
  const int64_t E = config_.num_experts, per = experts_per_rank_;
  const int64_t key = reinterpret_cast<int64_t>(group_.get());
  // This rank's (token, slot) pairs in ascending expert order, then token
  // order: the order one process runs and accumulates them in.
  std::vector<at::Tensor> tok, slot, expert;
  std::vector<int64_t> send(size_, 0);
  for (int64_t e = 0; e < E; ++e) {
    at::Tensor hits = idx.eq(e).nonzero();  // [M, 2]
    if (hits.size(0) == 0) continue;
    tok.push_back(hits.select(1, 0));
    slot.push_back(hits.select(1, 1));
    expert.push_back(at::full({hits.size(0)}, e, at::kLong));
    send[e / per] += hits.size(0);
  }
  const auto cat_or_empty = [](const std::vector<at::Tensor>& v) {
    return v.empty() ? at::empty({0}, at::kLong) : at::cat(v);
  };
  at::Tensor send_tokens = cat_or_empty(tok), send_slots = cat_or_empty(slot), send_experts = cat_or_empty(expert);
  // The counts, then the rows and their expert ids.
  at::Tensor counts = at::tensor(send, at::kLong);
  at::Tensor recv_counts = AllToAll(group_.get(), counts, std::vector<int64_t>(size_, 1),
                                    std::vector<int64_t>(size_, 1));
  std::vector<int64_t> recv(recv_counts.data_ptr<int64_t>(), recv_counts.data_ptr<int64_t>() + size_);
  at::Tensor recv_experts = AllToAll(group_.get(), send_experts, send, recv);
  const double scale = grad_scale_, unscale = grad_scale_ > 0 ? 1.0 / grad_scale_ : 0.0;
  // Dispatch: the rows go to their experts' ranks. The gradient coming back
  // to this rank's tokens is unscaled (it was scaled on the way out).
  at::Tensor x = ExchangeRows::apply(tokens.index_select(0, send_tokens), key, send, recv, 1.0, unscale);
  // This rank's experts on every rank's rows for them.
  // x * 0, not zeros: the output keeps x's graph even when no row came for
  // this rank's experts, so every rank runs both exchanges' backward.
  at::Tensor y = x * 0;
  for (int64_t j = 0; j < per; ++j) {
    const int64_t e = rank_ * per + j;
    at::Tensor rows = recv_experts.eq(e).nonzero().squeeze(1);
    if (rows.size(0) == 0) continue;
    y = y.index_add(0, rows, moe.experts[e]->as<actor::MlpImpl>()->forward(x.index_select(0, rows)));
  }
  // Combine: the outputs come back; their gradient leaves scaled by this
  // rank's share of the global weight.
  at::Tensor back = ExchangeRows::apply(y, key, recv, send, scale, 1.0);
  // + back.sum() * 0: the same, for a rank that sent no row.
  at::Tensor out = at::zeros_like(tokens) + back.sum() * 0;
  int64_t offset = 0;
  for (size_t i = 0; i < tok.size(); ++i) {
    const int64_t n = tok[i].size(0);
    at::Tensor part = back.narrow(0, offset, n) * weights.index({tok[i], slot[i]}).unsqueeze(-1);
    out.index_add_(0, tok[i], part.to(out.scalar_type()));
    offset += n;
  }
  return out;
}

absl::Status ExpertParallelModel::PrepareBackward(double local_weight) {
  if (!(local_weight >= 0) || !std::isfinite(local_weight)) {
    return absl::InvalidArgumentError("local_weight: must be finite and >= 0");
  }
  double global = local_weight;
  if (size_ > 1 || options_.data_group) {
    at::Tensor t = at::full({1}, local_weight, at::kDouble);
    RLMESH_RETURN_IF_ERROR(dist::Collective("all-reduce of the local weights", [&] {
      SumOverAllRanks(t);
    }));
    global = t.item<double>();
  }
  if (!(global > 0)) return absl::InvalidArgumentError("local_weight: the global weight over all ranks is 0");
  local_weight_ = local_weight;
  global_weight_ = global;
  grad_scale_ = local_weight / global;
  return absl::OkStatus();
}

void ExpertParallelModel::ZeroGrad() { adamw_->ZeroGrad(); }

absl::StatusOr<DataParallelStepStats> ExpertParallelModel::Step(double lr) {
  if (local_weight_ < 0) return absl::FailedPreconditionError("Step: call PrepareBackward before the backward");
  DataParallelStepStats stats;
  stats.global_weight = global_weight_;
  double sq = 0;
  RLMESH_RETURN_IF_ERROR(dist::Collective("expert-parallel gradient reduction", [&] {
    at::NoGradGuard no_grad;
    auto grad_of = [](const at::Tensor& p) { return p.grad().defined() ? p.grad() : at::zeros_like(p); };
    // Replicated parameters: the weighted mean of the ranks' local-mean
    // gradients.
    std::vector<at::Tensor> parts;
    for (const at::Tensor& p : replicated_) parts.push_back(grad_of(p).reshape({-1}) * local_weight_);
    at::Tensor flat = at::cat(parts);
    SumOverAllRanks(flat);
    flat.div_(global_weight_);
    int64_t offset = 0;
    for (at::Tensor& p : replicated_) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      p.grad().copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
    for (at::Tensor& p : local_experts_) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    }
    // Expert data parallelism: each group's share of the global mean,
    // summed over the groups.
    if (options_.data_group && !local_experts_.empty()) {
      std::vector<at::Tensor> grads;
      for (at::Tensor& p : local_experts_) grads.push_back(p.grad());
      std::vector<at::Tensor> v = {FlattenAll(grads)};
      options_.data_group->allreduce(v)->wait();
      const std::vector<at::Tensor> summed = UnflattenLike(v[0], grads);
      for (size_t i = 0; i < grads.size(); ++i) grads[i].copy_(summed[i]);
    }
    // The norm: the replicated part once, every expert once (the groups'
    // experts are alike).
    at::Tensor expert_sq = at::zeros({1}, at::kDouble);
    for (at::Tensor& p : local_experts_) expert_sq += p.grad().to(at::kDouble).pow(2).sum();
    if (size_ > 1) {
      std::vector<at::Tensor> v = {expert_sq};
      group_->allreduce(v)->wait();
    }
    sq = flat.to(at::kDouble).pow(2).sum().item<double>() + expert_sq.item<double>();
  }));
  stats.grad_norm = std::sqrt(sq);
  if (!std::isfinite(stats.grad_norm)) {
    stats.skipped = true;
    return stats;
  }
  if (options_.grad_clip > 0) {
    const double coef = options_.grad_clip / (stats.grad_norm + 1e-6);
    if (coef < 1.0) {
      at::NoGradGuard no_grad;
      for (at::Tensor& p : replicated_) p.grad().mul_(coef);
      for (at::Tensor& p : local_experts_) p.grad().mul_(coef);
    }
  }
  RLMESH_ASSIGN_OR_RETURN(DataParallelStepStats applied, adamw_->Step(1.0, lr));
  stats.update_seconds = applied.update_seconds;
  return stats;
}

void ExpertParallelModel::SumOverAllRanks(at::Tensor& t) {
  std::vector<at::Tensor> v = {t};
  if (size_ > 1) group_->allreduce(v)->wait();
  if (options_.data_group) options_.data_group->allreduce(v)->wait();
}

absl::Status ExpertParallelModel::LoadOptimizerState(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                                                     int64_t steps) {
  return adamw_->LoadOptimizerState(exp_avg, exp_avg_sq, steps);
}

absl::Status ExpertParallelModel::LoadWholeMoments(const Named& exp_avg, const Named& exp_avg_sq, int64_t steps) {
  auto mine = [&](const Named& whole, const char* what) -> absl::StatusOr<at::Tensor> {
    std::map<std::string, at::Tensor> by_name(whole.begin(), whole.end());
    std::vector<at::Tensor> parts;
    auto take = [&](const std::vector<std::string>& names, const std::vector<at::Tensor>& params) -> absl::Status {
      for (size_t i = 0; i < names.size(); ++i) {
        auto it = by_name.find(names[i]);
        if (it == by_name.end() || !it->second.defined() || it->second.sizes() != params[i].sizes()) {
          return absl::InvalidArgumentError(absl::StrCat(what, " of ", names[i], ": missing or not shaped ",
                                                         c10::str(params[i].sizes())));
        }
        parts.push_back(it->second.reshape({-1}));
      }
      return absl::OkStatus();
    };
    RLMESH_RETURN_IF_ERROR(take(replicated_names_, replicated_));
    RLMESH_RETURN_IF_ERROR(take(local_expert_names_, local_experts_));
    return at::cat(parts);
  };
  try {
    RLMESH_ASSIGN_OR_RETURN(at::Tensor m, mine(exp_avg, "exp_avg"));
    RLMESH_ASSIGN_OR_RETURN(at::Tensor v, mine(exp_avg_sq, "exp_avg_sq"));
    return adamw_->LoadOptimizerState(m, v, steps);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("expert-parallel moments: ", e.what_without_backtrace()));
  }
}

}  // namespace rlmesh::learner
