#pragma once

// The settings of a Gloo process group (dist/gloo.h), without LibTorch: a
// header that only carries them (learner/trainer.h) costs no c10d parse.

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace rlmesh::dist {

struct GlooGroupOptions {
  // Address the Gloo transport binds and advertises. Default loopback.
  // Ignored when GLOO_SOCKET_IFNAME names an interface: its address is used.
  std::string hostname = "127.0.0.1";
  // Collective and rendezvous timeout, milliseconds. Default 300000.
  int64_t timeout_ms = 300'000;
  // Gloo worker threads. Default 2.
  int threads = 2;

  absl::Status Validate() const;
};

}  // namespace rlmesh::dist
