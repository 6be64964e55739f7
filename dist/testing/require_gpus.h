#pragma once
// GPU tests' first line: fails the test case, naming the missing device,
// unless `needed` CUDA devices are visible (scripts/device_check.sh's dry
// run looks for "no CUDA device" in the log).

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

}  // namespace rlmesh::dist::testing
