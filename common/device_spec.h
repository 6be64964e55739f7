#pragma once

// The text of a device ("cpu", "cuda", "cuda:<index>") without LibTorch, so
// that the coordinator (which links no LibTorch) validates configs with the
// same rule the roles resolve them with (dist/device.h).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace rlmesh {

// Most CUDA devices one process may name (cuda:0 ... cuda:63).
inline constexpr int kMaxCudaDevices = 64;

// -1 for the CPU ("" or "cpu"), the CUDA index otherwise ("cuda" is 0).
// INVALID_ARGUMENT `<who>: "<spec>" is not cpu, cuda or cuda:<index> ...`.
inline absl::StatusOr<int> ParseDeviceSpec(absl::string_view spec, absl::string_view who) {
  if (spec.empty() || spec == "cpu") return -1;
  if (spec == "cuda") return 0;
  int index = -1;
  if (spec.size() > 5 && spec.substr(0, 5) == "cuda:" && absl::SimpleAtoi(spec.substr(5), &index) && index >= 0 &&
      index < kMaxCudaDevices && spec.substr(5).find_first_not_of("0123456789") == absl::string_view::npos) {
    return index;
  }
  return absl::InvalidArgumentError(absl::StrCat(who, ": \"", spec, "\" is not cpu, cuda or cuda:<index> (index in [0, ",
                                                 kMaxCudaDevices - 1, "])"));
}

}  // namespace rlmesh
