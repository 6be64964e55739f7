#pragma once

// Turning a c10d call that throws into a Status.

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rlmesh::dist {

// Runs f(); an exception (a collective's timeout, a peer that closed the
// connection) becomes ABORTED "<what> failed: ...": the group is unusable
// and the caller must rebuild it at a higher level.
template <typename F>
absl::Status Collective(const char* what, F&& f) {
  try {
    std::forward<F>(f)();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat(what, " failed: ", e.what()));
  }
}

}  // namespace rlmesh::dist
