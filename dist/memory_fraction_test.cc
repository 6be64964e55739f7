// The CUDA allocator's cap and the memory a process gives back. A binary of
// its own: the cap must be set before the CUDA backend loads, which is
// process-wide state.
#include <cstdlib>
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

}  // namespace
}  // namespace rlmesh::dist
