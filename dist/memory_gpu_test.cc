// The CUDA allocator's cap and cache on a real GPU (tags gpu, manual: run by
// scripts/device_check.sh where a GPU is lent; without one the case fails
// naming the missing device). What a colocated learner and rollout worker
// rely on: a process capped at a fraction cannot hold more than that, and
// a worker that sleeps hands its cached blocks back to the device.
#include <string>

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include "catch2/catch.hpp"
#include "dist/device.h"

namespace rlmesh::dist {
namespace {

TEST_CASE("on a GPU the memory fraction caps the allocator and a release gives the cache back", "[gpu]") {
  REQUIRE(SetCudaMemoryFraction(0.25, "memory_gpu_test").ok());
  absl::StatusOr<c10::Device> device = ResolveDevice("cuda", "memory_gpu_test");
  INFO(device.status().ToString());
  REQUIRE(device.ok());
  const int64_t total = static_cast<int64_t>(c10::getDeviceAllocator(c10::kCUDA)->getMemoryInfo(0).second);
  REQUIRE(total > 0);
  // A tenth of the GPU fits under the cap of a quarter; a third does not.
  const int64_t tenth = total / 10 / 4;  // fp32 elements
  {
    at::Tensor a = at::empty({tenth}, at::TensorOptions().device(*device));
    CHECK(ProcessMemoryBytes(*device) >= tenth * 4);
  }
  bool refused = false;
  try {
    at::Tensor b = at::empty({total / 3 / 4}, at::TensorOptions().device(*device));
  } catch (const c10::OutOfMemoryError&) {
    refused = true;
  }
  CHECK(refused);
  // Freed, the block stays reserved in the caching allocator until released.
  CHECK(ProcessMemoryBytes(*device) >= tenth * 4);
  ReleaseCachedMemory(*device);
  CHECK(ProcessMemoryBytes(*device) < tenth * 4 / 10);
}

}  // namespace
}  // namespace rlmesh::dist
