#pragma once
// GPU tests' first line: fails the test case, naming the missing device,
// unless `needed` CUDA devices are visible (scripts/device_check.sh's dry
// run looks for "no CUDA device" in the log). And the converse for the CPU
// tests of what a machine without a GPU does.

#include "catch2/catch.hpp"
#include "dist/device.h"

namespace rlmesh::dist::testing {

inline void RequireGpus(int needed) {
  auto devices = TorchCudaDeviceCount();
  INFO(devices.status().ToString());
  REQUIRE(devices.ok());
  INFO(*devices << " CUDA device(s) visible" << (*devices == 0 ? ": no CUDA device" : ""));
  REQUIRE(*devices >= needed);
}

// For a test of the no-GPU behaviour: true (with a warning naming
// `checked_in`, the GPU test that covers this machine) when a CUDA device
// is visible, so the caller returns; fails the test if the wheel cannot say.
inline bool GpuVisible(const char* checked_in) {
  auto devices = TorchCudaDeviceCount();
  INFO(devices.status().ToString());
  REQUIRE(devices.ok());  // the wheel is a CUDA build
  if (*devices == 0) return false;
  WARN("a GPU is visible: " << checked_in << " is the check here");
  return true;
}

}  // namespace rlmesh::dist::testing
