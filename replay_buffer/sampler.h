#pragma once

// Which groups a SampleGroups call returns: the selection logic of the replay
// store, on catalog summaries only (no RocksDB, no locks), so that it can be
// tested on its own. The store calls it under its catalog lock and then reads
// the picked groups' trajectories.
//
// Pure functions; the caller provides any synchronisation of the inputs.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "proto/replay_buffer.pb.h"
#include "replay_buffer/fenwick.h"
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
  // Groups passed over because the filter refused them.
  int skipped = 0;
  // FIFO: the seq after the last group looked at (where the next lease
  // starts); 0 for the random modes.
  int64_t end_seq = 0;
};

// The groups a SampleGroups request admits, in every mode.
struct SampleFilter {
  // Groups whose oldest sample's policy_version is below it are skipped.
  int64_t min_policy_version = 0;
  // Groups whose rewards are all equal are skipped.
  bool skip_zero_variance = false;

  bool Admits(const GroupSummary& g) const {
    return g.min_policy_version() >= min_policy_version && !(skip_zero_variance && g.zero_variance());
  }
};

// FIFO: walks `by_seq` upwards from `next_seq`, below `visible_limit` (seqs
// at or above it may still be being written), skipping seqs inside the
// `acked` ranges (keyed by their first seq), and takes the first `want`
// groups that `filter` admits. end_seq starts at next_seq.
Selection SelectFifo(const std::map<int64_t, GroupPtr>& by_seq, int64_t next_seq, int64_t visible_limit,
                     const std::map<int64_t, Lease>& acked, size_t want, const SampleFilter& filter);

// The random modes' index over one experiment's committed groups, kept up to
// date as groups are committed and trimmed, so that a SampleGroups call costs
// O(want * log groups) instead of a pass over every group.
//
// Groups are bucketed by their min_policy_version (a request's
// min_policy_version admits a suffix of the buckets) and, inside a bucket, by
// whether their rewards vary (skip_zero_variance drops the flat part). Each
// part keeps its groups in seq order with two Fenwick trees: counts for
// SAMPLE_UNIFORM, reward variance + 1e-6 for SAMPLE_PRIORITIZED. Four more
// Fenwick trees over the buckets, in version order, hold each bucket's
// totals (of the spread part, and of both parts), so a draw finds its bucket
// and then its group in two logarithmic searches.
//
// SAMPLE_UNIFORM: `want` draws with replacement, each admitted group equally
// likely. SAMPLE_PRIORITIZED: draws with replacement in proportion to reward
// variance + 1e-6 (the floor keeps zero-variance groups reachable). Both
// seeded by `seed` (mt19937_64). Picks nothing when fewer than `want` groups
// qualify. Uniform picks depend only on the set of groups and the seed, not
// on the order they were committed in or on earlier removals; prioritized
// picks likewise, up to floating-point rounding at a boundary.
//
// Not synchronised: the store calls it under its catalog lock.
class SampleIndex {
 public:
  // A group already present or removed before (same seq) is ignored: the
  // store never reuses a seq.
  void Add(const GroupPtr& group);
  // A group not present is ignored.
  void Remove(const GroupSummary& group);
  size_t size() const { return size_; }

  // The groups `filter` admits are those of the buckets from its
  // min_policy_version on (their spread parts only with skip_zero_variance):
  // the same groups SampleFilter::Admits accepts.
  Selection Select(SampleMode mode, uint64_t seed, size_t want, const SampleFilter& filter) const;

 private:
  struct Part {
    std::vector<int64_t> seqs;    // sorted; removed groups keep their seq
    std::vector<GroupPtr> slots;  // nullptr once removed
    Fenwick<int64_t> count;       // 1 live, 0 removed
    Fenwick<double> priority;     // reward variance + 1e-6, 0 removed
    int64_t live = 0;
  };
  struct Bucket {
    Part spread;  // rewards differ
    Part flat;    // zero variance
  };
  static void Insert(Part* part, const GroupPtr& group);
  static bool Erase(Part* part, int64_t seq);
  static void Compact(Part* part);
  // Copies bucket b's part totals into the bucket-level trees.
  void Refresh(size_t b);
  // Drops empty buckets once they are half of all buckets.
  void CompactBuckets();

  std::vector<int64_t> versions_;                 // sorted min_policy_versions
  std::vector<std::unique_ptr<Bucket>> buckets_;  // parallel to versions_
  Fenwick<int64_t> spread_count_, all_count_;     // per bucket
  Fenwick<double> spread_priority_, all_priority_;
  size_t size_ = 0;
  size_t empty_buckets_ = 0;
};

}  // namespace rlmesh::replay
