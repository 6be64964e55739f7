#pragma once

// A tiny regression problem shared by the data-parallel tests and the
// two-process worker: a 2-layer tanh MLP, a 13-row batch whose rows carry a
// random number of "tokens" (mask), a token-mean squared-error loss, and a
// training loop over DataParallel. Everything is drawn from explicit
// generators, so concurrent threads get the same numbers as one process.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "learner/data_parallel.h"
#include "learner/schedule.h"

namespace rlmesh::learner::testing {

struct ToyProblem {
  at::Tensor x;     // [rows, 8]
  at::Tensor y;     // [rows, 4]
  at::Tensor mask;  // [rows, 4], 0/1: tokens per row vary
};

ToyProblem MakeToyProblem(int64_t rows = 13, uint64_t seed = 7);

// W1 [15, 8], b1 [15], W2 [4, 15], b2 [4] (199 elements: odd, so ZeRO-1
// pads), requiring grad.
std::vector<at::Tensor> MakeToyParams(uint64_t seed);

// Rows [begin, end) of rank `rank` out of `world`: deliberately uneven
// (boundaries at rows * r^2 / world^2).
std::pair<int64_t, int64_t> ToyShard(int64_t rows, int rank, int world);

// Token-mean squared error over rows [begin, end) and its weight (the number
// of masked tokens there).
std::pair<at::Tensor, double> ToyLoss(const std::vector<at::Tensor>& params,
                                      const ToyProblem& problem, int64_t begin, int64_t end);

// Peak 3e-2, 2 warmup steps, cosine to 10% over 6 steps.
LrScheduleOptions DefaultToyLr();
// AdamW with weight decay 0.01 and a gradient clip of 0.5 (which bites).
DataParallelOptions DefaultToyDp();

struct ToyTrainOptions {
  // Optimizer steps.
  int steps = 6;
  // Learning-rate schedule (warmup then cosine by default here).
  LrScheduleOptions lr = DefaultToyLr();
  // Data-parallel settings (AdamW with weight decay, clipping that bites).
  DataParallelOptions dp = DefaultToyDp();
  // Where the parameters and the batch live (drawn on the CPU, then moved):
  // a GPU for NCCL groups. Default the CPU.
  c10::Device device{c10::kCPU};
};

// Trains MakeToyParams(init_seed) on this rank's ToyShard with DataParallel
// over `group` (null = one process), after broadcasting rank 0's parameters.
// Returns the final parameters flattened, on the CPU.
absl::StatusOr<at::Tensor> TrainToy(c10::intrusive_ptr<c10d::Backend> group,
                                    const ToyTrainOptions& options, uint64_t init_seed);

at::Tensor FlattenParams(const std::vector<at::Tensor>& params);

}  // namespace rlmesh::learner::testing
