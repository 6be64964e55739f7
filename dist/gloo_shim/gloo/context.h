#pragma once
// rlmesh shim: see learner/gloo_shim/README.md. Handled by pointer; the one
// member named here is used by an inline ProcessGroupGloo method that
// rlmesh code never calls (its definition lives in the wheel).
#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
