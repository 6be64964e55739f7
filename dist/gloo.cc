#include "dist/gloo.h"

// The only file that includes ProcessGroupGloo.hpp (see gloo_shim/README.md).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "dist/collective.h"

namespace rlmesh::dist {

absl::StatusOr<c10::intrusive_ptr<c10d::Backend>> CreateGlooGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    const GlooGroupOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  if (!store) return absl::InvalidArgumentError("store: must not be null");
  if (world_size < 1) return absl::InvalidArgumentError("world_size: must be >= 1");
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: must be in [0, ", world_size, "), got ", rank));
  }
  // torch 2.11's c10d flight recorder (on by default, process-wide) crashed
  // in recordWithResetEnabled when two Gloo groups of one process enqueued
  // collectives from two threads (a std::map insert race; seen 1 run in ~10
  // of data_parallel_test). Off unless the user asked for it.
  static std::once_flag fr_once;
  std::call_once(fr_once, [] { ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0); });
  c10::intrusive_ptr<c10d::Backend> group;
  RLMESH_RETURN_IF_ERROR(Collective("gloo rendezvous", [&] {
    auto opts = c10d::ProcessGroupGloo::Options::create(
        std::chrono::milliseconds(options.timeout_ms));
    // GLOO_SOCKET_IFNAME (PyTorch's own convention; the Slurm launcher sets
    // it from slurm.network_interface) wins over the hostname, which on a
    // multi-homed node or a node without DNS resolves to the wrong address
    // or to none.
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    opts->devices.push_back(ifname != nullptr && ifname[0] != 0
                                ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                                : c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
    opts->threads = options.threads;
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
    // A rank's connectFullMesh returns once its own ends of the pairs are
    // up, which can be before a peer's listener has handed it the same
    // connection. A rank that then drops the group at once (a layout
    // refused after the rendezvous, a failed step before the first
    // collective) closes sockets the peer is still finishing, and the peer
    // fails with "Connection closed by peer" instead of its own answer.
    // The barrier returns only when every rank's constructor has returned.
    group->barrier()->wait();
  }));
  return group;
}

}  // namespace rlmesh::dist
