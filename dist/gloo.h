#pragma once

// Gloo process groups (c10d::ProcessGroupGloo) for CPU collectives: the
// learner's data parallelism and the GLOO weight-sync backend both form
// theirs here. No model, no optimizer.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

// Creates a Gloo process group; blocks until all `world_size` ranks have
// joined through `store` and every rank's side of every connection is up
// (a barrier ends the rendezvous), or the timeout passes: ABORTED. So a
// rank may drop the group as soon as this returns without failing a peer. The first call
// sets TORCH_FR_BUFFER_SIZE=0 unless the environment already sets it: c10d's
// flight recorder races when several groups of one process run collectives
// from different threads (docs/decisions.md).
absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateGlooGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    const GlooGroupOptions& options = {});

}  // namespace rlmesh::dist
