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
#include "dist/gloo_options.h"

namespace rlmesh::dist {

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
