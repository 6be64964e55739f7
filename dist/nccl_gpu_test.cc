// ProcessGroupNCCL from libtorch_cuda_shim.so on GPUs: one rank on one GPU
// (what the device script can always run), and two ranks on two GPUs.
#include "dist/nccl.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <thread>

#include "catch2/catch.hpp"
#include "dist/collective.h"
#include "dist/device.h"
#include "dist/testing/require_gpus.h"

namespace rlmesh::dist {
namespace {

absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> OneRankGroup() {
  return CreateNcclGroup(c10::make_intrusive<c10d::HashStore>(), 0, 1, 30000);
}

TEST_CASE("One NCCL rank on one GPU: all-reduce and broadcast of device tensors", "[gpu]") {
  testing::RequireGpus(1);
  auto group = OneRankGroup();
  INFO(group.status().ToString());
  REQUIRE(group.ok());
  at::Tensor t = at::arange(1024, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0));
  std::vector<at::Tensor> v{t};
  (*group)->allreduce(v)->wait();
  CHECK(at::equal(t.cpu(), at::arange(1024, at::kFloat)));
  (*group)->broadcast(v)->wait();
  CHECK(at::equal(t.cpu(), at::arange(1024, at::kFloat)));
}

TEST_CASE("CollectiveOn stages a host tensor through a one-rank NCCL group's GPU", "[gpu]") {
  testing::RequireGpus(1);
  auto group = OneRankGroup();
  INFO(group.status().ToString());
  REQUIRE(group.ok());
  const c10::Device gpu(c10::kCUDA, 0);
  at::Tensor count = at::full({1}, 7, at::kLong);
  c10::Device seen = c10::kCPU;
  const absl::Status s = CollectiveOn("all-reduce of a count", gpu, count, [&](at::Tensor& x) {
    seen = x.device();
    x.add_(5);  // What the collective wrote must come back to the host.
    std::vector<at::Tensor> v{x};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    (*group)->allreduce(v, o)->wait();
  });
  REQUIRE(s.ok());
  CHECK(seen == gpu);
  CHECK(count.device().is_cpu());
  CHECK(count.item<int64_t>() == 12);
  // Handing NCCL the host tensor itself is what the staging avoids: refused.
  at::Tensor host = at::ones({2});
  const absl::Status direct = Collective("all-reduce of a host tensor", [&] {
    std::vector<at::Tensor> v{host};
    (*group)->allreduce(v)->wait();
  });
  INFO(direct.ToString());
  CHECK(direct.code() == absl::StatusCode::kAborted);
}

TEST_CASE("Two NCCL ranks on two GPUs sum a device tensor", "[gpu][multi_gpu]") {
  testing::RequireGpus(2);
  auto store = c10::make_intrusive<c10d::HashStore>();
  at::Tensor out[2];
  absl::Status status[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto group = CreateNcclGroup(store, r, 2, 30000);
      if (!group.ok()) {
        status[r] = group.status();
        return;
      }
      at::Tensor t = at::full({4096}, static_cast<float>(r + 1), at::TensorOptions().device(at::kCUDA, r));
      std::vector<at::Tensor> v{t};
      (*group)->allreduce(v)->wait();
      out[r] = t.cpu();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << status[r].ToString());
    REQUIRE(status[r].ok());
    CHECK(at::equal(out[r], at::full({4096}, 3.0f)));
  }
}

}  // namespace
}  // namespace rlmesh::dist
