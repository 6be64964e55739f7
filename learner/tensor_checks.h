#pragma once

// Internal helpers of learner/: argument checks that name the argument, and
// the boundary that turns LibTorch exceptions into absl::Status.

#include <ATen/core/Tensor.h>

#include <exception>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rlmesh::learner::internal {

inline std::string ShapeString(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

// OK when `t` is defined, has `dim` dimensions, and is floating point (or,
// with allow_bool, bool/integral as masks may be).
inline absl::Status CheckTensor(const at::Tensor& t, const char* name, int64_t dim,
                                bool allow_integral = false) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(name, ": tensor is undefined"));
  if (t.dim() != dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected ", dim, " dimensions, got shape ", ShapeString(t)));
  }
  if (!allow_integral && !t.is_floating_point()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected a floating-point tensor"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckSameShape(const at::Tensor& a, const char* a_name, const at::Tensor& b,
                                   const char* b_name) {
  if (a.sizes() != b.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat(b_name, ": shape ", ShapeString(b),
                                                   " does not match ", a_name, " shape ",
                                                   ShapeString(a)));
  }
  return absl::OkStatus();
}

// Copies the tensor `by_name` holds under `name` into `dst` (a parameter:
// the caller turns gradient recording off). INVALID_ARGUMENT naming the
// parameter when it is missing or its shape differs; `dst` is unchanged
// then. How the split models load their part of a whole model's weights.
inline absl::Status CopyNamed(const std::map<std::string, at::Tensor>& by_name, const std::string& name,
                              const at::Tensor& dst) {
  auto it = by_name.find(name);
  if (it == by_name.end()) return absl::InvalidArgumentError(absl::StrCat(name, ": missing"));
  if (it->second.sizes() != dst.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": shape ", ShapeString(it->second), ", the model's is ", ShapeString(dst)));
  }
  dst.copy_(it->second);
  return absl::OkStatus();
}

// Runs `f` (returning Status or StatusOr) and turns a LibTorch exception into
// INTERNAL, so that no exception crosses a learner/ function boundary.
template <typename F>
auto CatchTorch(F&& f) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("libtorch: ", e.what()));
  }
}

}  // namespace rlmesh::learner::internal
