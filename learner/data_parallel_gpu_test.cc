// Data parallelism on GPUs: DataParallel's flat buffers and AdamW on the
// parameters' GPU (one device), and K = 2 ranks over ProcessGroupNCCL on two
// GPUs reproducing one process (plain DP and ZeRO-1), with host statistics
// summed through the device. Tagged gpu + manual: run where GPUs are.
#include "dist/nccl.h"
#include "learner/data_parallel.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <ATen/ATen.h>

#include <future>
#include <vector>

#include "catch2/catch.hpp"
#include "dist/testing/require_gpus.h"
#include "learner/testing/dp_toy.h"

namespace rlmesh::learner {
namespace {

using testing::ToyTrainOptions;

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST_CASE("DataParallel on one GPU trains the toy problem as on the CPU", "[gpu]") {
  dist::testing::RequireGpus(1);
  for (bool zero1 : {false, true}) {
    INFO("zero1 " << zero1);
    ToyTrainOptions options;
    options.dp.zero1 = zero1;
    auto cpu = testing::TrainToy(nullptr, options, 100);
    options.device = c10::Device(c10::kCUDA, 0);
    auto gpu = testing::TrainToy(nullptr, options, 100);
    REQUIRE(cpu.ok());
    INFO(gpu.status().ToString());
    REQUIRE(gpu.ok());
    // fp32 on both; only the kernels' summation order differs.
    CHECK(MaxAbsDiff(*cpu, *gpu) < 1e-5);
    // Training moved the parameters (the comparison is not vacuous).
    CHECK(MaxAbsDiff(*cpu, testing::FlattenParams(testing::MakeToyParams(100))) > 1e-2);
  }
}

// Rank r trains on GPU r over one NCCL group; returns each rank's parameters
// (on the CPU) and the host statistic each summed through the group.
struct RankResult {
  absl::StatusOr<at::Tensor> flat = absl::UnknownError("not run");
  at::Tensor summed;
  c10::intrusive_ptr<c10d::Backend> group;
};

std::vector<RankResult> TrainOnGpus(ToyTrainOptions options) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<RankResult>> futures;
  for (int rank = 0; rank < 2; ++rank) {
    futures.push_back(std::async(std::launch::async, [=]() mutable {
      RankResult r;
      auto group = dist::CreateNcclGroup(store, rank, 2, 60'000);
      if (!group.ok()) {
        r.flat = group.status();
        return r;
      }
      r.group = *group;
      options.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank));
      // Different initial weights per rank: the broadcast has to fix them.
      r.flat = testing::TrainToy(r.group, options, 100 + rank);
      if (!r.flat.ok()) return r;
      // A statistic on the host, summed over the GPUs' group.
      std::vector<at::Tensor> params = {at::zeros({4}, at::TensorOptions().device(options.device))};
      auto dp = DataParallel::Create(r.group, params, options.dp);
      if (!dp.ok()) {
        r.flat = dp.status();
        return r;
      }
      r.summed = at::full({3}, static_cast<double>(rank + 1), at::kDouble);
      if (absl::Status s = (*dp)->AllReduceSum(r.summed); !s.ok()) r.flat = s;
      return r;
    }));
  }
  std::vector<RankResult> out;
  for (auto& f : futures) {
    REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    out.push_back(f.get());
  }
  return out;
}

TEST_CASE("Two ranks over NCCL on two GPUs train as one process", "[gpu][multi_gpu]") {
  dist::testing::RequireGpus(2);
  for (bool zero1 : {false, true}) {
    INFO("zero1 " << zero1);
    ToyTrainOptions options;
    options.dp.zero1 = zero1;
    auto one = testing::TrainToy(nullptr, options, 100);
    REQUIRE(one.ok());
    std::vector<RankResult> ranks = TrainOnGpus(options);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << ranks[r].flat.status().ToString());
      REQUIRE(ranks[r].flat.ok());
      // K = 2 ≡ K = 1 within fp32 reduction order (the CPU test's bound is 1e-5).
      CHECK(MaxAbsDiff(*one, *ranks[r].flat) < 1e-4);
      // The statistic stayed on the host and holds 1 + 2.
      CHECK(ranks[r].summed.device().is_cpu());
      CHECK(at::equal(ranks[r].summed, at::full({3}, 3.0, at::kDouble)));
    }
    // Every rank holds the same parameters, bit for bit.
    CHECK(at::equal(*ranks[0].flat, *ranks[1].flat));
  }
}

}  // namespace
}  // namespace rlmesh::learner
