#pragma once

// Turning a c10d call that throws into a Status, and running a collective
// on a host tensor over a group whose collectives take device tensors.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rlmesh::dist {

// Runs f(); an exception (a Gloo collective's timeout, a peer that closed
// the connection, a collective refused at once) becomes ABORTED "<what>
// failed: ...": the group is unusable and the caller must rebuild it at a
// higher level. An NCCL collective's timeout throws nothing: the group's
// watchdog ends the process (dist/nccl.h).
template <typename F>
absl::Status Collective(const char* what, F&& f) {
  try {
    std::forward<F>(f)();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat(what, " failed: ", e.what()));
  }
}

// Collective(what, ...) of f(x) for a host tensor `t` (a statistic, a
// count) over a group whose collectives run on `device`: on the CPU (Gloo)
// x is t itself; on a GPU (NCCL takes device tensors only) x is a copy of t
// there, and f's result is copied back into t (that copy waits for the
// collective).
template <typename F>
absl::Status CollectiveOn(const char* what, const c10::Device& device, at::Tensor& t, F&& f) {
  return Collective(what, [&] {
    if (device.is_cpu()) {
      f(t);
      return;
    }
    at::Tensor staged = t.to(device);
    f(staged);
    t.copy_(staged);
  });
}

}  // namespace rlmesh::dist
