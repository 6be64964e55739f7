#include "learner/testing/dp_toy.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "common/status_macros.h"
#include "learner/losses.h"

namespace rlmesh::learner::testing {

LrScheduleOptions DefaultToyLr() {
  LrScheduleOptions o;
  o.peak_lr = 3e-2;
  o.warmup_steps = 2;
  o.total_steps = 6;
  o.decay = LrDecay::kCosine;
  o.min_lr_ratio = 0.1;
  return o;
}

DataParallelOptions DefaultToyDp() {
  DataParallelOptions o;
  o.adamw.weight_decay = 0.01;
  o.grad_clip = 0.5;
  return o;
}

ToyProblem MakeToyProblem(int64_t rows, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  ToyProblem p;
  p.x = at::randn({rows, 8}, gen, at::kFloat);
  p.y = at::randn({rows, 4}, gen, at::kFloat);
  p.mask = at::bernoulli(at::full({rows, 4}, 0.6), gen).to(at::kFloat);
  p.mask.select(1, 0).fill_(1.0);  // Every row has at least one token.
  return p;
}

std::vector<at::Tensor> MakeToyParams(uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> params = {
      at::randn({15, 8}, gen, at::kFloat) * 0.4, at::randn({15}, gen, at::kFloat) * 0.1,
      at::randn({4, 15}, gen, at::kFloat) * 0.3, at::randn({4}, gen, at::kFloat) * 0.1};
  for (at::Tensor& t : params) t.requires_grad_(true);
  return params;
}

std::pair<int64_t, int64_t> ToyShard(int64_t rows, int rank, int world) {
  auto bound = [&](int r) { return rows * r * r / (static_cast<int64_t>(world) * world); };
  return {bound(rank), bound(rank + 1)};
}

std::pair<at::Tensor, double> ToyLoss(const std::vector<at::Tensor>& params,
                                      const ToyProblem& problem, int64_t begin, int64_t end) {
  at::Tensor x = problem.x.narrow(0, begin, end - begin);
  at::Tensor y = problem.y.narrow(0, begin, end - begin);
  at::Tensor mask = problem.mask.narrow(0, begin, end - begin);
  at::Tensor h = at::tanh(at::linear(x, params[0], params[1]));
  at::Tensor pred = at::linear(h, params[2], params[3]);
  at::Tensor loss = AggregateLoss((pred - y).pow(2), mask, LossAgg::kTokenMean).value();
  return {loss, mask.sum().item<double>()};
}

at::Tensor FlattenParams(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : params) flat.push_back(p.detach().reshape({-1}));
  return at::cat(flat);
}

absl::StatusOr<at::Tensor> TrainToy(c10::intrusive_ptr<c10d::Backend> group,
                                    const ToyTrainOptions& options, uint64_t init_seed) {
  const int rank = group ? group->getRank() : 0;
  const int world = group ? group->getSize() : 1;
  ToyProblem problem = MakeToyProblem();
  std::vector<at::Tensor> params = MakeToyParams(init_seed);
  if (!options.device.is_cpu()) {
    for (at::Tensor* t : {&problem.x, &problem.y, &problem.mask}) *t = t->to(options.device);
    for (at::Tensor& p : params) p = p.detach().to(options.device).requires_grad_(true);
  }
  RLMESH_ASSIGN_OR_RETURN(auto dp, DataParallel::Create(group, params, options.dp));
  RLMESH_RETURN_IF_ERROR(dp->BroadcastParameters());
  auto [begin, end] = ToyShard(problem.x.size(0), rank, world);
  for (int step = 0; step < options.steps; ++step) {
    dp->ZeroGrad();
    auto [loss, weight] = ToyLoss(params, problem, begin, end);
    loss.backward();
    RLMESH_ASSIGN_OR_RETURN(DataParallelStepStats stats,
                            dp->Step(weight, LearningRate(options.lr, step)));
    if (stats.skipped) return absl::InternalError("toy step skipped: non-finite gradient");
  }
  return FlattenParams(params).cpu();
}

}  // namespace rlmesh::learner::testing
