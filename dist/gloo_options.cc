#include "dist/gloo_options.h"

namespace rlmesh::dist {

absl::Status GlooGroupOptions::Validate() const {
  if (hostname.empty()) return absl::InvalidArgumentError("hostname: must not be empty");
  if (timeout_ms <= 0) return absl::InvalidArgumentError("timeout_ms: must be > 0");
  if (threads <= 0) return absl::InvalidArgumentError("threads: must be > 0");
  return absl::OkStatus();
}

}  // namespace rlmesh::dist
