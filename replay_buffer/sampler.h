#pragma once

// Which groups a SampleGroups call returns: the selection logic of the replay
// store, on catalog summaries only (no RocksDB, no locks), so that it can be
// tested on its own. The store calls it under its catalog lock and then reads
// the picked groups' trajectories.
//
// Pure functions; the caller provides any synchronisation of the inputs.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "proto/replay_buffer.pb.h"
#include "replay_buffer/group_summary.h"

namespace rlmesh::replay {

using GroupPtr = std::shared_ptr<const GroupSummary>;

// A FIFO lease of one consumer: seqs [from, to) delivered as `groups` groups,
// unacknowledged until `expires` (acked ranges waiting to become contiguous
// with the cursor have expires = InfiniteFuture()).
struct Lease {
  int64_t from = 0;
  int64_t to = 0;
  int64_t groups = 0;
  absl::Time expires;
};

struct Selection {
  // In the order they are to be returned.
  std::vector<GroupPtr> picked;
  // Groups passed over because `accept` refused them.
  int skipped = 0;
  // FIFO: the seq after the last group looked at (where the next lease
  // starts); 0 for the random modes.
  int64_t end_seq = 0;
};

using Accept = std::function<bool(const GroupSummary&)>;

// FIFO: walks `by_seq` upwards from `next_seq`, below `visible_limit` (seqs
// at or above it may still be being written), skipping seqs inside the
// `acked` ranges (keyed by their first seq), and takes the first `want`
// groups that `accept` admits. end_seq starts at next_seq.
Selection SelectFifo(const std::map<int64_t, GroupPtr>& by_seq, int64_t next_seq, int64_t visible_limit,
                     const std::map<int64_t, Lease>& acked, size_t want, const Accept& accept);

// SAMPLE_UNIFORM: `want` draws with replacement, each group admitted by
// `accept` equally likely. SAMPLE_PRIORITIZED: draws with replacement in
// proportion to reward variance + 1e-6 (the floor keeps zero-variance groups
// reachable). Both seeded by `seed` (mt19937_64): the same catalog and seed
// give the same picks. Picks nothing when fewer than `want` groups qualify.
Selection SelectRandom(const std::map<int64_t, GroupPtr>& by_seq, SampleMode mode, uint64_t seed, size_t want,
                       const Accept& accept);

}  // namespace rlmesh::replay
