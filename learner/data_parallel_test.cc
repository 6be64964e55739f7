// Data parallelism: K = 2 ranks (threads over a HashStore, and two real
// processes over a TCPStore) must produce the parameters of one process
// trained on the whole batch with torch::optim::AdamW, within 1e-5, for plain
// DP and for ZeRO-1 (native and emulated reduce-scatter).
#include "dist/gloo.h"
#include "dist/store.h"
#include "learner/data_parallel.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "learner/schedule.h"
#include "learner/testing/dp_toy.h"

namespace rlmesh::learner {
namespace {

using testing::DefaultToyDp;
using testing::ToyTrainOptions;

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// One process, the whole batch, LibTorch's own AdamW and our clipping: the
// reference every data-parallel run must reproduce.
at::Tensor ReferenceTrain(const ToyTrainOptions& options) {
  testing::ToyProblem problem = testing::MakeToyProblem();
  std::vector<at::Tensor> params = testing::MakeToyParams(/*seed=*/100);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1.0)
                                      .betas({options.dp.adamw.beta1, options.dp.adamw.beta2})
                                      .eps(options.dp.adamw.eps)
                                      .weight_decay(options.dp.adamw.weight_decay));
  for (int step = 0; step < options.steps; ++step) {
    opt.zero_grad();
    auto [loss, weight] = testing::ToyLoss(params, problem, 0, problem.x.size(0));
    loss.backward();
    std::vector<at::Tensor> grads;
    for (auto& p : params) grads.push_back(p.grad());
    REQUIRE(ClipGradNorm(grads, options.dp.grad_clip).ok());
    static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[0].options())
        .lr(LearningRate(options.lr, step));
    opt.step();
  }
  return testing::FlattenParams(params);
}

// Trains the toy problem on `world` threads, each with its own Gloo group
// over one shared HashStore. Returns each rank's final parameters. The groups
// are destroyed only after every rank has finished, as separate processes
// would: tearing down one rank's Gloo pairs while a peer still uses them is
// not something the learner does.
std::vector<at::Tensor> TrainOnThreads(int world, const ToyTrainOptions& options) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  struct Result {
    absl::StatusOr<at::Tensor> flat = absl::UnknownError("not run");
    c10::intrusive_ptr<c10d::Backend> group;
  };
  std::vector<std::future<Result>> futures;
  for (int rank = 0; rank < world; ++rank) {
    futures.push_back(std::async(std::launch::async, [=]() {
      Result r;
      dist::GlooGroupOptions gloo;
      gloo.timeout_ms = 60'000;
      auto group = dist::CreateGlooGroup(store, rank, world, gloo);
      if (!group.ok()) {
        r.flat = group.status();
        return r;
      }
      r.group = *group;
      // Different initial weights per rank: the broadcast has to fix them.
      r.flat = testing::TrainToy(r.group, options, /*init_seed=*/100 + rank);
      return r;
    }));
  }
  std::vector<Result> results;
  for (auto& f : futures) {
    REQUIRE(f.wait_for(std::chrono::seconds(90)) == std::future_status::ready);
    results.push_back(f.get());
  }
  std::vector<at::Tensor> out;
  for (Result& r : results) {
    REQUIRE(r.flat.ok());
    out.push_back(*r.flat);
  }
  return out;
}

TEST_CASE("AdamWUpdate matches torch::optim::AdamW") {
  at::manual_seed(3);
  at::Tensor a = torch::randn({5, 3}, torch::requires_grad());
  at::Tensor b = a.detach().clone();
  AdamWOptions o;
  o.weight_decay = 0.1;
  torch::optim::AdamW opt({a}, torch::optim::AdamWOptions(0.05).weight_decay(0.1));
  at::Tensor m = torch::zeros_like(b), v = torch::zeros_like(b);
  for (int step = 1; step <= 5; ++step) {
    at::Tensor g = torch::randn({5, 3});
    a.mutable_grad() = g.clone();
    opt.step();
    REQUIRE(AdamWUpdate(b, g, m, v, step, 0.05, o).ok());
  }
  CHECK(MaxAbsDiff(a.detach(), b) == 0.0);
  // And the update moved the parameters (the comparison is not vacuous).
  at::manual_seed(3);
  CHECK(MaxAbsDiff(torch::randn({5, 3}), b) > 1e-2);
}

TEST_CASE("one process: DataParallel equals the LibTorch reference") {
  ToyTrainOptions options;
  const at::Tensor reference = ReferenceTrain(options);
  const at::Tensor init = testing::FlattenParams(testing::MakeToyParams(100));
  REQUIRE(MaxAbsDiff(reference, init) > 1e-2);  // Training moved the weights.
  for (bool zero1 : {false, true}) {
    CAPTURE(zero1);
    options.dp.zero1 = zero1;
    auto flat = testing::TrainToy(nullptr, options, 100);
    REQUIRE(flat.ok());
    CHECK(MaxAbsDiff(*flat, reference) < 1e-6);
  }
}

TEST_CASE("two threads: plain DP and ZeRO-1 equal one process within 1e-5") {
  ToyTrainOptions options;
  const at::Tensor reference = ReferenceTrain(options);
  struct Mode {
    const char* name;
    bool zero1;
    bool emulate;
    int64_t bucket_bytes;
  };
  // "emulated" replaces both reduce-scatter and all-gather by all-reduce.
  for (Mode mode : {Mode{"dp", false, false, 25 << 20}, Mode{"dp-small-buckets", false, false, 1024},
                    Mode{"zero1-native", true, false, 25 << 20},
                    Mode{"zero1-emulated", true, true, 1024}}) {
    CAPTURE(mode.name);
    options.dp.zero1 = mode.zero1;
    options.dp.emulate_reduce_scatter = mode.emulate;
    options.dp.emulate_all_gather = mode.emulate;
    options.dp.bucket_bytes = mode.bucket_bytes;
    std::vector<at::Tensor> ranks = TrainOnThreads(2, options);
    CHECK(MaxAbsDiff(ranks[0], ranks[1]) == 0.0);  // Replicas never drift apart.
    CHECK(MaxAbsDiff(ranks[0], reference) < 1e-5);
  }
}

TEST_CASE("three threads: ZeRO-1 with uneven padding equals one process") {
  ToyTrainOptions options;
  options.dp.zero1 = true;
  const at::Tensor reference = ReferenceTrain(options);
  std::vector<at::Tensor> ranks = TrainOnThreads(3, options);
  for (const at::Tensor& r : ranks) CHECK(MaxAbsDiff(r, reference) < 1e-5);
}

TEST_CASE("a wrong gradient convention would be caught") {
  // Averaging the local means (what naive DP does) differs from the global
  // mean by far more than the tolerance on this ragged split: the tests
  // above would fail if Step weighted ranks equally.
  testing::ToyProblem problem = testing::MakeToyProblem();
  std::vector<at::Tensor> params = testing::MakeToyParams(100);
  auto [l0, w0] = testing::ToyLoss(params, problem, 0, 3);
  auto [l1, w1] = testing::ToyLoss(params, problem, 3, 13);
  auto [lg, wg] = testing::ToyLoss(params, problem, 0, 13);
  CHECK(w0 != w1);
  CHECK(std::abs((l0 + l1).item<double>() / 2 - lg.item<double>()) > 1e-3);
  CHECK(std::abs((l0 * w0 + l1 * w1).item<double>() / (w0 + w1) - lg.item<double>()) < 1e-5);
}

TEST_CASE("ZeRO-1 shards the optimizer state") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  struct Shard {
    absl::Status status;
    int64_t state = 0, begin = 0, end = 0;
  };
  std::vector<std::future<Shard>> futures;
  for (int rank = 0; rank < 2; ++rank) {
    // No Catch2 assertions off the main thread: results come back instead.
    futures.push_back(std::async(std::launch::async, [=] {
      Shard s;
      auto group = dist::CreateGlooGroup(store, rank, 2);
      if (!group.ok()) return Shard{group.status()};
      DataParallelOptions o;
      o.zero1 = true;
      auto dp = DataParallel::Create(*group, testing::MakeToyParams(1), o);
      if (!dp.ok()) return Shard{dp.status()};
      s.state = (*dp)->exp_avg().numel();
      s.begin = (*dp)->shard_begin();
      s.end = (*dp)->shard_end();
      return s;
    }));
  }
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(futures[rank].wait_for(std::chrono::seconds(60)) == std::future_status::ready);
    Shard s = futures[rank].get();
    REQUIRE(s.status.ok());
    CHECK(s.state == 100);  // 199 elements padded to 200, halved.
    CHECK(s.begin == 100 * rank);
    CHECK(s.end == 100 * (rank + 1));
  }
}

TEST_CASE("bad input is INVALID_ARGUMENT, not a crash") {
  DataParallelOptions o;
  CHECK(DataParallel::Create(nullptr, {}, o).status().code() ==
        absl::StatusCode::kInvalidArgument);
  auto bf16 = DataParallel::Create(nullptr, {at::zeros({3}, at::kBFloat16)}, o);
  CHECK(bf16.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bf16.status().message().find("params[0]") != std::string::npos);
  o.bucket_bytes = 0;
  CHECK(DataParallel::Create(nullptr, {at::zeros({3})}, o).status().code() ==
        absl::StatusCode::kInvalidArgument);

  auto dp = DataParallel::Create(nullptr, testing::MakeToyParams(1), DataParallelOptions());
  REQUIRE(dp.ok());
  CHECK((*dp)->Step(-1.0, 1e-3).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK((*dp)->Step(0.0, 1e-3).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK((*dp)->Step(1.0, -1.0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK((*dp)->steps() == 0);
  CHECK((*dp)->LoadOptimizerState(at::zeros({3}), at::zeros({3}), 1).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("norm weights and ranges: the reported norm weighs each element as asked; bad ranges are refused") {
  // Two parameters with known gradients: [1, 2, 2] and [4, 4].
  auto make = [](const DataParallelOptions& o) {
    std::vector<at::Tensor> params = {at::zeros({3}), at::zeros({2})};
    auto dp = DataParallel::Create(nullptr, params, o);
    params[0].mutable_grad() = at::tensor({1.0f, 2.0f, 2.0f});
    params[1].mutable_grad() = at::tensor({4.0f, 4.0f});
    return dp;
  };
  DataParallelOptions o;
  o.norm_weights = {1.0, 0.5};
  o.norm_ranges = {{{1, 3, 0.25}}, {}};  // elements 1 and 2 of the first weigh 1/4
  auto dp = make(o);
  REQUIRE(dp.ok());
  auto stats = (*dp)->Step(1.0, 1e-3);
  REQUIRE(stats.ok());
  // 1 + 0.25 * (4 + 4) + 0.5 * (16 + 16) = 19.
  CHECK(stats->grad_norm == Approx(std::sqrt(19.0)).epsilon(1e-6));
  for (const auto& bad : std::vector<std::vector<std::vector<DataParallelOptions::NormRange>>>{
           {{{0, 4, 0.5}}, {}}, {{{2, 1, 0.5}}, {}}, {{{0, 1, -1.0}}, {}}, {{}}}) {
    o.norm_ranges = bad;
    auto refused = make(o);
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(refused.status().message().find("norm_ranges") != std::string::npos);
  }
}

TEST_CASE("a non-finite gradient skips the step and changes nothing") {
  std::vector<at::Tensor> params = testing::MakeToyParams(1);
  const at::Tensor before = testing::FlattenParams(params);
  auto dp = DataParallel::Create(nullptr, params, DataParallelOptions());
  REQUIRE(dp.ok());
  for (auto& p : params) p.mutable_grad() = at::full_like(p, std::nan(""));
  auto stats = (*dp)->Step(1.0, 1e-2);
  REQUIRE(stats.ok());
  CHECK(stats->skipped);
  CHECK(MaxAbsDiff(testing::FlattenParams(params), before) == 0.0);
  CHECK((*dp)->steps() == 0);
}

// Two real processes over a TCPStore on 127.0.0.1 (the port chosen by rank
// 0's store and passed through a port file), each writing its parameters.
TEST_CASE("two processes over a TCPStore equal one process") {
  for (bool zero1 : {false, true}) {
    CAPTURE(zero1);
    rlmesh::testing::TempDir dir;
    const std::string worker = rlmesh::testing::Runfile("learner/dp_toy_worker");
    const std::string port_file = dir.File("port");
    auto args = [&](int rank) {
      std::vector<std::string> a = {worker,
                                    "--rank=" + std::to_string(rank),
                                    "--world=2",
                                    "--zero1=" + std::string(zero1 ? "true" : "false"),
                                    "--out=" + dir.File("out" + std::to_string(rank))};
      return a;
    };
    std::vector<std::string> a0 = args(0);
    a0.push_back("--port_file=" + port_file);
    auto rank0 = Subprocess::Start(a0, dir.File("log0"));
    REQUIRE(rank0.ok());
    auto port = ReadPortFile(port_file, absl::Seconds(30));
    REQUIRE(port.ok());
    std::vector<std::string> a1 = args(1);
    a1.push_back("--port=" + std::to_string(*port));
    auto rank1 = Subprocess::Start(a1, dir.File("log1"));
    REQUIRE(rank1.ok());
    for (Subprocess* p : {&*rank0, &*rank1}) {
      auto status = p->Wait(absl::Seconds(60));
      REQUIRE(status.ok());
      CHECK(DescribeWaitStatus(*status) == "exit 0");
    }
    ToyTrainOptions options;
    options.dp.zero1 = zero1;
    const at::Tensor reference = ReferenceTrain(options);
    for (int rank = 0; rank < 2; ++rank) {
      std::ifstream in(dir.File("out" + std::to_string(rank)), std::ios::binary);
      std::vector<float> values(reference.numel());
      in.read(reinterpret_cast<char*>(values.data()), values.size() * sizeof(float));
      REQUIRE(in.gcount() == static_cast<std::streamsize>(values.size() * sizeof(float)));
      at::Tensor got = at::from_blob(values.data(), {reference.numel()}).clone();
      CHECK(MaxAbsDiff(got, reference) < 1e-5);
    }
  }
}

}  // namespace
}  // namespace rlmesh::learner
