#include "learner/data_parallel.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "dist/collective.h"
#include "learner/tensor_checks.h"

namespace rlmesh::learner {
namespace {

using dist::Collective;

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

void Wait(const c10::intrusive_ptr<c10d::Work>& work) {
  // Work::wait throws on failure or on the group's timeout.
  work->wait();
}

// torch's clip_grad_norm_ coefficient, given the norm.
void ClipToNorm(at::Tensor& grads, double norm, double max_norm) {
  if (max_norm <= 0) return;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) grads.mul_(coef);
}

}  // namespace

absl::Status DataParallelOptions::Validate() const {
  if (bucket_bytes < 1024) return absl::InvalidArgumentError("bucket_bytes: must be >= 1024");
  if (!(grad_clip >= 0)) return absl::InvalidArgumentError("grad_clip: must be >= 0");
  for (double w : norm_weights) {
    if (!(w >= 0) || !std::isfinite(w)) {
      return absl::InvalidArgumentError("norm_weights: every weight must be finite and >= 0");
    }
  }
  return adamw.Validate();
}

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(
    c10::intrusive_ptr<c10d::Backend> group, std::vector<at::Tensor> params,
    const DataParallelOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  if (params.empty()) return absl::InvalidArgumentError("params: must not be empty");
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.defined()) return absl::InvalidArgumentError(absl::StrCat("params[", i, "]: undefined"));
    if (p.scalar_type() != at::kFloat && p.scalar_type() != at::kDouble) {
      return absl::InvalidArgumentError(absl::StrCat(
          "params[", i, "]: dtype ", c10::toString(p.scalar_type()),
          " unsupported; keep fp32 (or fp64) master weights"));
    }
    if (p.scalar_type() != params[0].scalar_type() || p.device() != params[0].device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("params[", i, "]: dtype and device must match params[0]"));
    }
  }
  if (!options.norm_weights.empty() && options.norm_weights.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("norm_weights: ", options.norm_weights.size(),
                                                   " weights for ", params.size(), " parameters"));
  }
  if (!options.norm_ranges.empty()) {
    if (options.norm_ranges.size() != params.size()) {
      return absl::InvalidArgumentError(absl::StrCat("norm_ranges: ", options.norm_ranges.size(), " lists for ",
                                                     params.size(), " parameters"));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      for (const auto& r : options.norm_ranges[i]) {
        if (r.begin < 0 || r.end < r.begin || r.end > params[i].numel() || !(r.weight >= 0) ||
            !std::isfinite(r.weight)) {
          return absl::InvalidArgumentError(absl::StrCat("norm_ranges[", i, "]: [", r.begin, ", ", r.end,
                                                         ") weight ", r.weight, " is not a range of its ",
                                                         params[i].numel(), " elements with a finite weight >= 0"));
        }
      }
    }
  }
  std::unique_ptr<DataParallel> dp(new DataParallel());
  dp->group_ = group;
  dp->options_ = options;
  if (group) {
    dp->rank_ = group->getRank();
    dp->world_size_ = group->getSize();
  }
  dp->params_ = std::move(params);
  for (const at::Tensor& p : dp->params_) {
    dp->offsets_.push_back(dp->numel_);
    dp->numel_ += p.numel();
  }
  const int64_t K = dp->world_size_;
  const int64_t elem_bytes = dp->params_[0].element_size();
  dp->bucket_elems_ = std::max<int64_t>(1, options.bucket_bytes / elem_bytes);
  RLMESH_RETURN_IF_ERROR(internal::CatchTorch([&]() -> absl::Status {
    at::NoGradGuard no_grad;
    auto opts = dp->params_[0].options().requires_grad(false);
    if (options.zero1) {
      dp->padded_ = (dp->numel_ + K - 1) / K * K;
      const int64_t shard = dp->padded_ / K;
      dp->shard_begin_ = dp->rank_ * shard;
      dp->shard_end_ = dp->shard_begin_ + shard;
      dp->flat_params_ = at::zeros({dp->padded_}, opts);
      dp->flat_grads_ = at::zeros({dp->padded_}, opts);
      dp->shard_grads_ = at::zeros({shard}, opts);
      dp->shard_params_ = at::zeros({shard}, opts);
    } else {
      dp->padded_ = dp->numel_;
      dp->shard_begin_ = 0;
      dp->shard_end_ = dp->numel_;
      dp->flat_params_ = at::zeros({dp->numel_}, opts);
      dp->flat_grads_ = at::zeros({dp->numel_ + 1}, opts);
    }
    dp->exp_avg_ = at::zeros({dp->shard_end_ - dp->shard_begin_}, opts);
    dp->exp_avg_sq_ = at::zeros_like(dp->exp_avg_);
    return absl::OkStatus();
  }));
  return dp;
}

void DataParallel::PackParams(at::Tensor& flat) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    flat.narrow(0, offsets_[i], params_[i].numel()).copy_(params_[i].detach().reshape({-1}));
  }
}

void DataParallel::UnpackParams(const at::Tensor& flat) {
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].detach();
    p.copy_(flat.narrow(0, offsets_[i], p.numel()).view(p.sizes()));
  }
}

void DataParallel::PackGrads(at::Tensor& flat, double scale) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor slot = flat.narrow(0, offsets_[i], params_[i].numel());
    const at::Tensor& g = params_[i].grad();
    if (!g.defined()) {
      slot.zero_();
    } else if (scale == 1.0) {
      slot.copy_(g.detach().reshape({-1}));
    } else {
      // Scaling while copying: one pass over the gradient instead of two.
      at::mul_out(slot, g.detach().reshape({-1}), scale);
    }
  }
}

void DataParallel::AllReduceBuckets(at::Tensor& flat, int64_t n) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int64_t begin = 0; begin < n; begin += bucket_elems_) {
    std::vector<at::Tensor> bucket = {flat.narrow(0, begin, std::min(bucket_elems_, n - begin))};
    works.push_back(group_->allreduce(bucket));
  }
  for (auto& w : works) Wait(w);
}

absl::StatusOr<double> DataParallel::WeightedSquaredNorm(const at::Tensor& grads, int64_t begin) const {
  const int64_t end = begin + grads.numel();
  double sq = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t lo = std::max(begin, offsets_[i]);
    const int64_t hi = std::min(end, offsets_[i] + params_[i].numel());
    if (lo >= hi) continue;
    const at::Tensor part = grads.narrow(0, lo - begin, hi - lo);
    const double w = options_.norm_weights.empty() ? 1.0 : options_.norm_weights[i];
    RLMESH_ASSIGN_OR_RETURN(const double n, GlobalNorm({part}));
    sq += w * n * n;
    if (options_.norm_ranges.empty()) continue;
    // Elements of a range weigh r.weight instead of w.
    for (const auto& r : options_.norm_ranges[i]) {
      const int64_t rlo = std::max(lo, offsets_[i] + r.begin), rhi = std::min(hi, offsets_[i] + r.end);
      if (rlo >= rhi) continue;
      RLMESH_ASSIGN_OR_RETURN(const double m, GlobalNorm({grads.narrow(0, rlo - begin, rhi - rlo)}));
      sq += (r.weight - w) * m * m;
    }
  }
  return sq;
}

void DataParallel::SumOverModelShards(double& sq) const {
  if (options_.norm_groups.empty()) return;
  // On the parameters' device, where the groups' collectives run.
  at::Tensor t = at::full({1}, sq, params_[0].options().dtype(at::kDouble));
  for (const auto& g : options_.norm_groups) {
    if (!g) continue;
    std::vector<at::Tensor> v = {t};
    Wait(g->allreduce(v));
  }
  sq = t.item<double>();
}

absl::Status DataParallel::AllReduceSum(at::Tensor& t) {
  if (!t.defined() || !t.is_contiguous() || !t.device().is_cpu()) {
    return absl::InvalidArgumentError("t: expected a defined contiguous CPU tensor");
  }
  if (world_size_ == 1) return absl::OkStatus();
  // The group's collectives run where the parameters live (NCCL: the GPU).
  return dist::CollectiveOn("all-reduce of statistics", params_[0].device(), t, [&](at::Tensor& x) {
    std::vector<at::Tensor> v = {x};
    Wait(group_->allreduce(v));
  });
}

void DataParallel::ZeroGrad() {
  for (at::Tensor& p : params_) {
    if (p.grad().defined()) p.grad().zero_();
  }
}

absl::Status DataParallel::BroadcastParameters() {
  if (world_size_ == 1) return absl::OkStatus();
  return Collective("broadcast parameters", [&] {
    at::NoGradGuard no_grad;
    PackParams(flat_params_);
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int64_t begin = 0; begin < numel_; begin += bucket_elems_) {
      std::vector<at::Tensor> bucket = {
          flat_params_.narrow(0, begin, std::min(bucket_elems_, numel_ - begin))};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      works.push_back(group_->broadcast(bucket, opts));
    }
    for (auto& w : works) Wait(w);
    UnpackParams(flat_params_);
  });
}

absl::StatusOr<DataParallelStepStats> DataParallel::Step(double local_weight, double lr) {
  if (!(local_weight >= 0) || !std::isfinite(local_weight)) {
    return absl::InvalidArgumentError("local_weight: must be finite and >= 0");
  }
  if (!(lr >= 0) || !std::isfinite(lr)) return absl::InvalidArgumentError("lr: must be >= 0");
  return options_.zero1 ? StepZero1(local_weight, lr) : StepReplicated(local_weight, lr);
}

absl::StatusOr<DataParallelStepStats> DataParallel::StepReplicated(double local_weight,
                                                                   double lr) {
  DataParallelStepStats stats;
  at::NoGradGuard no_grad;
  absl::Time t0 = absl::Now();
  double global_weight = local_weight;
  RLMESH_RETURN_IF_ERROR(Collective("gradient all-reduce", [&] {
    if (world_size_ == 1) {
      // One process: the local mean already is the global mean.
      PackGrads(flat_grads_, 1.0);
      return;
    }
    // The weight rides in the last element, so that one pass of buckets
    // carries both the weighted gradient sum and W.
    PackGrads(flat_grads_, local_weight);
    flat_grads_[numel_].fill_(local_weight);
    AllReduceBuckets(flat_grads_, numel_ + 1);
    global_weight = flat_grads_[numel_].item<double>();
  }));
  stats.global_weight = global_weight;
  if (!(global_weight > 0)) {
    return absl::InvalidArgumentError("local_weight: the global weight over all ranks is 0");
  }
  at::Tensor grads = flat_grads_.narrow(0, 0, numel_);
  if (world_size_ > 1) grads.div_(global_weight);
  stats.reduce_seconds = SecondsSince(t0);

  absl::Time t1 = absl::Now();
  if (!options_.norm_groups.empty() || !options_.norm_weights.empty() || !options_.norm_ranges.empty()) {
    RLMESH_ASSIGN_OR_RETURN(double sq, WeightedSquaredNorm(grads, 0));
    RLMESH_RETURN_IF_ERROR(Collective("gradient norm over model shards", [&] { SumOverModelShards(sq); }));
    stats.grad_norm = std::sqrt(sq);
    if (std::isfinite(stats.grad_norm)) ClipToNorm(grads, stats.grad_norm, options_.grad_clip);
  } else {
    RLMESH_ASSIGN_OR_RETURN(stats.grad_norm, ClipGradNorm({grads}, options_.grad_clip));
  }
  if (!std::isfinite(stats.grad_norm)) {
    stats.skipped = true;
    return stats;
  }
  RLMESH_RETURN_IF_ERROR(internal::CatchTorch([&]() -> absl::Status {
    PackParams(flat_params_);
    RLMESH_RETURN_IF_ERROR(
        AdamWUpdate(flat_params_, grads, exp_avg_, exp_avg_sq_, steps_ + 1, lr, options_.adamw));
    UnpackParams(flat_params_);
    return absl::OkStatus();
  }));
  ++steps_;
  stats.update_seconds = SecondsSince(t1);
  return stats;
}

absl::StatusOr<DataParallelStepStats> DataParallel::StepZero1(double local_weight, double lr) {
  DataParallelStepStats stats;
  at::NoGradGuard no_grad;
  const int64_t shard = shard_end_ - shard_begin_;
  absl::Time t0 = absl::Now();
  double global_weight = local_weight;
  double sum_sq = 0;
  RLMESH_RETURN_IF_ERROR(Collective("gradient reduce-scatter", [&] {
    if (world_size_ == 1) {
      PackGrads(flat_grads_, 1.0);
      shard_grads_.copy_(flat_grads_);
      sum_sq = *WeightedSquaredNorm(shard_grads_, shard_begin_);
      SumOverModelShards(sum_sq);
      return;
    }
    PackGrads(flat_grads_, local_weight);
    if (options_.emulate_reduce_scatter) {
      AllReduceBuckets(flat_grads_, padded_);
      shard_grads_.copy_(flat_grads_.narrow(0, shard_begin_, shard));
    } else {
      Wait(group_->_reduce_scatter_base(shard_grads_, flat_grads_));
    }
    // W and the squared norm of the (unnormalised) sum travel together.
    at::Tensor scalars = at::empty({2}, flat_grads_.options().dtype(at::kDouble));
    scalars[0].fill_(local_weight);
    scalars[1].fill_(*WeightedSquaredNorm(shard_grads_, shard_begin_));
    std::vector<at::Tensor> v = {scalars};
    Wait(group_->allreduce(v));
    global_weight = scalars[0].item<double>();
    sum_sq = scalars[1].item<double>();
    SumOverModelShards(sum_sq);
  }));
  stats.global_weight = global_weight;
  if (!(global_weight > 0)) {
    return absl::InvalidArgumentError("local_weight: the global weight over all ranks is 0");
  }
  const double scale = world_size_ == 1 ? 1.0 : global_weight;
  if (scale != 1.0) shard_grads_.div_(scale);
  stats.grad_norm = std::sqrt(sum_sq) / scale;
  stats.reduce_seconds = SecondsSince(t0);
  if (!std::isfinite(stats.grad_norm)) {
    stats.skipped = true;
    return stats;
  }

  absl::Time t1 = absl::Now();
  RLMESH_RETURN_IF_ERROR(internal::CatchTorch([&]() -> absl::Status {
    ClipToNorm(shard_grads_, stats.grad_norm, options_.grad_clip);
    PackParams(flat_params_);
    shard_params_.copy_(flat_params_.narrow(0, shard_begin_, shard));
    return AdamWUpdate(shard_params_, shard_grads_, exp_avg_, exp_avg_sq_, steps_ + 1, lr,
                       options_.adamw);
  }));
  stats.update_seconds = SecondsSince(t1);

  absl::Time t2 = absl::Now();
  RLMESH_RETURN_IF_ERROR(Collective("parameter all-gather", [&] {
    if (world_size_ == 1) {
      flat_params_.copy_(shard_params_);
    } else if (options_.emulate_all_gather) {
      // Sum of zeros and one owner per element: exact, and Gloo's ring
      // all-reduce measured faster than its all-gather (bench/learner.md).
      flat_params_.zero_();
      flat_params_.narrow(0, shard_begin_, shard).copy_(shard_params_);
      AllReduceBuckets(flat_params_, padded_);
    } else {
      Wait(group_->_allgather_base(flat_params_, shard_params_));
    }
    UnpackParams(flat_params_);
  }));
  ++steps_;
  stats.gather_seconds = SecondsSince(t2);
  return stats;
}

absl::Status DataParallel::LoadOptimizerState(const at::Tensor& exp_avg,
                                              const at::Tensor& exp_avg_sq, int64_t steps) {
  if (steps < 0) return absl::InvalidArgumentError("steps: must be >= 0");
  if (!exp_avg.defined() || exp_avg.sizes() != exp_avg_.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat("exp_avg: expected shape ",
                                                   internal::ShapeString(exp_avg_), ", got ",
                                                   internal::ShapeString(exp_avg)));
  }
  if (!exp_avg_sq.defined() || exp_avg_sq.sizes() != exp_avg_sq_.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat("exp_avg_sq: expected shape ",
                                                   internal::ShapeString(exp_avg_sq_), ", got ",
                                                   internal::ShapeString(exp_avg_sq)));
  }
  return internal::CatchTorch([&]() -> absl::Status {
    exp_avg_.copy_(exp_avg);
    exp_avg_sq_.copy_(exp_avg_sq);
    steps_ = steps;
    return absl::OkStatus();
  });
}

absl::Status DataParallel::LoadWholeOptimizerState(const at::Tensor& exp_avg,
                                                   const at::Tensor& exp_avg_sq, int64_t steps) {
  for (const auto& [t, what] : {std::make_pair(&exp_avg, "exp_avg"), std::make_pair(&exp_avg_sq, "exp_avg_sq")}) {
    if (!t->defined() || t->dim() != 1 || t->numel() != numel_) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": expected [", numel_, "] (every element), got ",
                                                     internal::ShapeString(*t)));
    }
  }
  return internal::CatchTorch([&]() -> absl::Status {
    // This rank's range; past numel_ it is ZeRO-1's zero padding.
    const int64_t n = std::max<int64_t>(0, std::min(shard_end_, numel_) - shard_begin_);
    auto share = [&](const at::Tensor& whole) {
      at::Tensor out = at::zeros({shard_end_ - shard_begin_}, exp_avg_.options());
      if (n > 0) out.narrow(0, 0, n).copy_(whole.narrow(0, shard_begin_, n));
      return out;
    };
    return LoadOptimizerState(share(exp_avg), share(exp_avg_sq), steps);
  });
}

std::vector<at::Tensor> UnflattenLike(const at::Tensor& flat, const std::vector<at::Tensor>& like) {
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const at::Tensor& p : like) {
    out.push_back(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return out;
}

at::Tensor FlattenAll(const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : parts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

}  // namespace rlmesh::learner
