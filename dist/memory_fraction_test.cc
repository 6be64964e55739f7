// The CUDA allocator's cap and the memory a process gives back. A binary of
// its own: the cap must be set before the CUDA backend loads, which is
// process-wide state.
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "catch2/catch.hpp"
#include "dist/device.h"

namespace rlmesh::dist {
namespace {

TEST_CASE("the memory fraction joins PYTORCH_ALLOC_CONF before the backend loads, and is refused after") {
  ::setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False", 1);
  for (double bad : {0.0, -0.5, 1.5}) {
    absl::Status s = SetCudaMemoryFraction(bad, "rollout-0 --cuda_memory_fraction");
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("rollout-0 --cuda_memory_fraction") != std::string::npos);
  }
  CHECK(std::string(std::getenv("PYTORCH_ALLOC_CONF")) == "expandable_segments:False");
  REQUIRE(SetCudaMemoryFraction(0.25, "x").ok());
  CHECK(std::string(std::getenv("PYTORCH_ALLOC_CONF")) ==
        "expandable_segments:False,per_process_memory_fraction:0.25");
  // Once the backend is asked for (loaded or not), the allocator may have
  // read its settings: too late.
  LoadCudaBackend().IgnoreError();
  absl::Status late = SetCudaMemoryFraction(0.5, "learner --cuda_memory_fraction");
  CHECK(late.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(late.message()).find("learner --cuda_memory_fraction") != std::string::npos);
}

TEST_CASE("on the CPU, freed memory goes back to the system and the resident set shows it") {
  const c10::Device cpu(c10::kCPU);
  // Many blocks below malloc's mmap threshold, and one kept above them:
  // freed, they stay in the heap (free() only trims the heap's top) until
  // ReleaseCachedMemory.
  std::vector<at::Tensor> blocks;
  for (int i = 0; i < 2000; ++i) blocks.push_back(at::ones({16 * 1024}));  // 64 KiB each, 125 MiB
  const at::Tensor top = at::ones({16 * 1024});
  const int64_t full = ProcessMemoryBytes(cpu);
  blocks.clear();
  const int64_t freed = ProcessMemoryBytes(cpu);
  ReleaseCachedMemory(cpu);
  const int64_t after = ProcessMemoryBytes(cpu);
  INFO("resident " << full << ", freed " << freed << ", released " << after);
  CHECK(full - after > 100 * 1024 * 1024);
  CHECK(top.sum().item<float>() == 16 * 1024);
}

TEST_CASE("running out of memory is RESOURCE_EXHAUSTED naming the size asked for; other errors keep their code") {
  absl::Status cpu;
  try {
    at::empty({int64_t{1} << 50});  // 4 PiB
  } catch (const std::exception& e) {
    cpu = ExceptionStatus(e, absl::StatusCode::kInternal, "learner-0 TrainStep");
  }
  INFO(cpu.ToString());
  CHECK(cpu.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(cpu.message()).find("learner-0 TrainStep: out of memory: ") == 0);
  CHECK(std::string(cpu.message()).find("4503599627370496 bytes") != std::string::npos);
  absl::Status gpu;
  try {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total ",
                     "capacity of 139.81 GiB");
  } catch (const std::exception& e) {
    gpu = ExceptionStatus(e, absl::StatusCode::kAborted, "tensor-parallel rank 1");
  }
  CHECK(gpu.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(gpu.message()).find("tensor-parallel rank 1: out of memory: CUDA out of memory. Tried to allocate "
                                        "2.00 GiB. GPU 0") == 0);
  absl::Status other;
  try {
    at::ones({2}).view({3});
  } catch (const std::exception& e) {
    other = ExceptionStatus(e, absl::StatusCode::kAborted, "weight swap");
  }
  CHECK(other.code() == absl::StatusCode::kAborted);
  CHECK(std::string(other.message()).find("weight swap: ") == 0);
  CHECK(std::string(other.message()).find("Exception raised from") == std::string::npos);  // no backtrace
  CHECK(ExceptionStatus(std::runtime_error("boom"), absl::StatusCode::kInternal, "x").message() == "x: boom");
}

}  // namespace
}  // namespace rlmesh::dist
