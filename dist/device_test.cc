// Device specs and the CUDA backend. On a machine with no GPU (CI here) the
// CUDA cases must be refused with the role and the device named; where a GPU
// is visible (the device script) they must resolve and hold a tensor. The
// CUDA runtime's own device count (dist/cuda_api, dlopen of libcudart)
// decides which of the two is asserted: it does not go through torch.
#include "dist/device.h"

#include <ATen/ATen.h>

#include "catch2/catch.hpp"
#include "dist/cuda_api.h"

namespace rlmesh::dist {
namespace {

TEST_CASE("device specs parse; anything else is refused naming the role", "[device]") {
  auto cpu = ParseDevice("", "learner-0 model.device");
  REQUIRE(cpu.ok());
  CHECK(cpu->is_cpu());
  CHECK(ParseDevice("cpu", "x")->is_cpu());
  auto cuda = ParseDevice("cuda", "x");
  REQUIRE(cuda.ok());
  CHECK(cuda->is_cuda());
  CHECK(cuda->index() == 0);
  auto three = ParseDevice("cuda:3", "x");
  REQUIRE(three.ok());
  CHECK(three->index() == 3);
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:64", "CUDA", "cuda:1:2", "mps"}) {
    INFO(bad);
    auto d = ParseDevice(bad, "rollout-1 --device");
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(d.status().message()).find("rollout-1 --device") != std::string::npos);
    CHECK(std::string(d.status().message()).find(bad) != std::string::npos);
    // ResolveDevice refuses the same text before it loads anything.
    CHECK(ResolveDevice(bad, "r").status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("cpu resolves without loading the CUDA backend", "[device]") {
  auto d = ResolveDevice("cpu", "learner-0");
  REQUIRE(d.ok());
  CHECK(d->is_cpu());
}

TEST_CASE("cuda resolves where the CUDA runtime sees a GPU, and is refused by name where it sees none", "[device]") {
  absl::StatusOr<int> runtime = CudaDeviceCount();  // FAILED_PRECONDITION when none
  const int gpus = runtime.ok() ? *runtime : 0;
  INFO("CUDA runtime: " << (runtime.ok() ? std::to_string(*runtime) : runtime.status().ToString()));
  // The wheel this project installs is the CUDA build: its backend loads
  // with or without a GPU.
  REQUIRE(LoadCudaBackend().ok());
  auto torch_count = TorchCudaDeviceCount();
  REQUIRE(torch_count.ok());
  CHECK(*torch_count == gpus);
  if (gpus == 0) {
    auto d = ResolveDevice("cuda", "learner-0 model.device");
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kFailedPrecondition);
    const std::string m(d.status().message());
    CHECK(m.find("learner-0 model.device=cuda:0") != std::string::npos);
    CHECK(m.find("no CUDA device visible") != std::string::npos);
    CHECK(m.find("CUDA_VISIBLE_DEVICES") != std::string::npos);
  } else {
    auto d = ResolveDevice("cuda", "learner-0 model.device");
    REQUIRE(d.ok());
    auto t = at::ones({4}, at::TensorOptions().device(*d));
    CHECK(t.sum().item<float>() == 4.0f);
    auto past = ResolveDevice("cuda:" + std::to_string(gpus), "rollout-0 --device");
    REQUIRE_FALSE(past.ok());
    CHECK(std::string(past.status().message()).find("only " + std::to_string(gpus)) != std::string::npos);
  }
}

}  // namespace
}  // namespace rlmesh::dist
