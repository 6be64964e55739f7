// libtorch_cuda_shim.so loads into a CPU-only binary and LibTorch's
// ProcessGroupNCCL runs up to its own device check: here, with no GPU, a
// FAILED_PRECONDITION in its words. (dist/nccl_gpu_test runs it on a GPU.)
#include "dist/cuda_shim.h"
#include "dist/nccl.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <cstdlib>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "dist/device.h"
#include "dist/testing/require_gpus.h"

namespace rlmesh::dist {
namespace {

TEST_CASE("An NCCL group without a GPU is refused in ProcessGroupNCCL's words, the shared object loaded") {
  if (testing::GpuVisible("dist/nccl_gpu_test")) return;
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = CreateNcclGroup(store, 0, 1, 5000);
  INFO(group.status().ToString());
  REQUIRE(group.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(group.status().message(), "NCCL group (rank 0 of 1): "));
  // Only the constructor inside the shared object says this.
  CHECK(absl::StrContains(group.status().message(), "ProcessGroupNCCL is only supported with GPUs"));
}

// TORCH_NCCL_BLOCKING_WAIT=1 would block the host in every Work::wait and
// leave no watchdog; the group must not set it (or anything that turns the
// watchdog's error handling off).
TEST_CASE("Making an NCCL group leaves ProcessGroupNCCL's wait and error handling at PyTorch's defaults") {
  unsetenv("TORCH_NCCL_BLOCKING_WAIT");
  unsetenv("NCCL_BLOCKING_WAIT");
  unsetenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  auto group = CreateNcclGroup(c10::make_intrusive<c10d::HashStore>(), 0, 1, 5000);
  INFO(group.status().ToString());  // refused here without a GPU, after the options are made
  CHECK(std::getenv("TORCH_NCCL_BLOCKING_WAIT") == nullptr);
  CHECK(std::getenv("NCCL_BLOCKING_WAIT") == nullptr);
  CHECK(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING") == nullptr);
}

TEST_CASE("The shared object is looked for at the override first, then beside the binary") {
  setenv("RLMESH_TORCH_CUDA_SHIM", "/nowhere/libtorch_cuda_shim.so", 1);
  auto c = TorchCudaShimCandidates();
  unsetenv("RLMESH_TORCH_CUDA_SHIM");
  REQUIRE(c.size() >= 3);
  CHECK(c[0] == "/nowhere/libtorch_cuda_shim.so");
  CHECK(absl::EndsWith(c[1], "/libtorch_cuda_shim.so"));
  CHECK(absl::EndsWith(c[2], ".runfiles/rlmesh/dist/libtorch_cuda_shim.so"));
}

}  // namespace
}  // namespace rlmesh::dist
