#pragma once

// ReplayStore: the durable trajectory store behind the ReplayBuffer service.
// It knows nothing of gRPC: requests and responses are the proto messages of
// proto/replay_buffer.proto, errors are absl::Status.
//
// Layout (RocksDB column families; integers big-endian so scans are ordered):
//   data      exp \0 step(be64) seq(be64) sample(be32)  -> Trajectory (proto)
//   groups    exp \0 seq(be64)                          -> group summary
//   by_prompt exp \0 prompt_id \0 step(be64) seq(be64)  -> ""
//   meta      'e' exp                                   -> "" (experiment registry)
//             'g' exp \0 group_id                       -> seq(be64)
//             't' exp \0 trajectory_id                  -> seq(be64)
//             'c' exp \0 consumer                       -> cursor (next seq, consumed)
// `seq` is a per-experiment arrival number assigned at Put; FIFO order is seq
// order. One WriteBatch per PutGroups call (sync WAL) makes a call, and so
// each of its groups, land whole or not at all. An in-memory catalog of group summaries (rebuilt from `groups` at
// Open) serves Sample, Stats, Trim and the filters of Query without reading
// trajectory bodies.
//
// Files: store.cc (open, put, sample), catalog.cc, cursors.cc (FIFO cursors
// and acks), query.cc (Query, Stats), trim.cc, export.cc; the pure parts in
// format.h (keys and values), tokens.h (page and ack tokens), filter.h and
// sampler.h (which groups a sample returns, testable without RocksDB).
//
// Delivery guarantees of FIFO sampling (per consumer):
//   require_ack = false: at-most-once. The cursor is advanced and synced to
//     disk before the groups are returned; a response lost in transit is not
//     redelivered.
//   require_ack = true: at-least-once. Groups are leased; the persisted cursor
//     moves only when AckSample is called with the returned token. Unacked
//     leases are redelivered after a server restart or after ack_timeout.
//     An acknowledged AckSample is final: those groups are never delivered to
//     that consumer again.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/replay_buffer.pb.h"
#include "replay_buffer/group_summary.h"
#include "replay_buffer/sampler.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
struct ColumnFamilyDescriptor;
class Status;
struct DBOptions;
}  // namespace rocksdb

namespace rlmesh {

struct ReplayStoreOptions {
  // Directory of the RocksDB database; created if missing. Required.
  std::string db_path;
  // Sync the WAL before a write is acknowledged. Default true. Only tests and
  // benchmarks that measure the cost turn it off.
  bool sync_writes = true;
  // Store trajectory records at least this large in blob files. Bytes.
  // Default 4096.
  int64_t min_blob_size = 4096;
  // Use RocksDB's integrated BlobDB for the data column family. Default true.
  bool enable_blob_files = true;
  // Largest serialized group accepted by PutGroups. Bytes. Default 32 MiB.
  int64_t max_group_bytes = 32 << 20;
  // Most samples in one group. Default 4096.
  int32_t max_group_size = 4096;
  // Most groups one SampleGroups call may ask for. Default 100'000.
  int32_t max_sample_groups = 100'000;
  // Most trajectories one Query page may return. Default 10'000.
  int32_t max_query_limit = 10'000;
  // Unacknowledged FIFO leases are redelivered after this long. Default 60 s.
  absl::Duration ack_timeout = absl::Seconds(60);
  // Size of one Export chunk before it is handed to the caller. Bytes.
  // Default 1 MiB.
  int64_t export_chunk_bytes = 1 << 20;
  // RocksDB block cache for all column families. Bytes. Default 256 MiB.
  int64_t block_cache_bytes = 256 << 20;

  absl::Status Validate() const;
};

// Safe for concurrent use by any number of threads.
class ReplayStore {
 public:
  // Opens (or creates) the database and rebuilds the in-memory catalog.
  static absl::StatusOr<std::unique_ptr<ReplayStore>> Open(const ReplayStoreOptions& options);
  ~ReplayStore();
  ReplayStore(const ReplayStore&) = delete;
  ReplayStore& operator=(const ReplayStore&) = delete;

  // Validates every group first, then writes the request's new groups in one
  // synced WriteBatch: nothing is written if one group is bad or conflicts
  // with a stored one. A group whose group id is already stored with the same
  // trajectory ids counts as a duplicate; an id twice in one request is
  // refused.
  absl::StatusOr<PutGroupsResponse> PutGroups(const PutGroupsRequest& request);

  // Returns request.num_groups() whole groups, waiting until `deadline` for
  // enough matching groups to exist. If there are not enough by then it
  // returns DEADLINE_EXCEEDED and consumes nothing. `cancelled`, when set, is
  // polled while waiting (an RPC whose client went away). An experiment with
  // no data yet is waited for, not rejected.
  absl::StatusOr<SampleGroupsResponse> SampleGroups(const SampleGroupsRequest& request,
                                                    absl::Time deadline,
                                                    const std::function<bool()>& cancelled = {});

  // Acknowledges a FIFO lease (see the guarantees above). Idempotent.
  absl::Status AckSample(const AckSampleRequest& request);

  absl::StatusOr<QueryResponse> Query(const QueryRequest& request);
  absl::StatusOr<StatsResponse> Stats(const StatsRequest& request);
  absl::StatusOr<TrimResponse> Trim(const TrimRequest& request);

  // Streams JSONL chunks to `sink`; a sink that returns false stops the
  // export (the caller went away) and Export returns CANCELLED.
  absl::Status Export(const ExportRequest& request,
                      const std::function<bool(ExportChunk&)>& sink);

  // Wakes every waiting SampleGroups call, which then returns UNAVAILABLE.
  // Later calls still work. Call before destroying the store while calls
  // may be in flight.
  void Shutdown();

  // The RocksDB handle and column families, for benchmarks that compare
  // against direct access.
  const ReplayStoreOptions& options() const { return options_; }

  // The catalog's view of a group (replay_buffer/group_summary.h).
  using SampleInfo = replay::SampleInfo;
  using GroupSummary = replay::GroupSummary;

 private:
  using Lease = replay::Lease;
  struct Consumer {
    int64_t persisted_next = 0;  // next seq, on disk
    int64_t consumed = 0;        // groups delivered (acked), on disk
    int64_t lease_next = 0;      // next seq to hand out (>= persisted_next)
    std::map<int64_t, Lease> leases;  // by from_seq, unacked
    std::map<int64_t, Lease> acked;   // acked but not yet contiguous
  };
  struct Experiment {
    int64_t next_seq = 1;
    std::map<int64_t, std::shared_ptr<const GroupSummary>> by_seq;
    std::map<std::pair<int64_t, int64_t>, std::shared_ptr<const GroupSummary>> by_step;
    replay::SampleIndex random_index;  // the random modes' view of by_seq
    std::set<int64_t> inflight_seqs;
    absl::flat_hash_set<std::string> inflight_ids;  // group ids being written
    int64_t trajectories = 0;
    int64_t bytes = 0;
    // Policy version -> stored trajectories generated by it: Stats' version
    // range without a scan of every sample under the lock.
    std::map<int64_t, int64_t> versions;
    void CountVersions(const GroupSummary& g, int64_t sign) {
      for (const auto& x : g.samples) {
        int64_t& n = versions[x.policy_version];
        n += sign;
        if (n == 0) versions.erase(x.policy_version);
      }
    }
    std::map<std::string, Consumer> consumers;
    // seq below which every group is committed or abandoned.
    int64_t visible_limit() const;
  };

  explicit ReplayStore(ReplayStoreOptions options);
  absl::Status OpenDb();
  absl::Status LoadCatalog();
  // PutGroups after validation: all groups of the request in one synced
  // WriteBatch (a request lands whole or not at all).
  absl::StatusOr<PutGroupsResponse> WriteGroups(const PutGroupsRequest& request);
  absl::Status PersistCursor(const std::string& exp, const std::string& consumer, int64_t next,
                             int64_t consumed);
  Experiment* FindExperiment(const std::string& exp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<std::shared_ptr<const GroupSummary>>> SnapshotGroups(
      const std::string& exp);
  absl::StatusOr<TrajectoryGroup> ReadGroup(const std::string& exp, const GroupSummary& g);
  // A failed write's status for the caller: RESOURCE_EXHAUSTED naming
  // db_path for a full disk. After a NoSpace error RocksDB refuses every
  // write (with the same error) until its SstFileManager, which polls the
  // free space every 5 s, finds room above its reserve and resumes the
  // database by itself.
  absl::Status WriteError(const rocksdb::Status& s, absl::string_view what);

  // Constant after Open.
  const ReplayStoreOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::ColumnFamilyHandle* data_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* groups_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* prompt_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* meta_cf_ = nullptr;

  // Serializes cursor updates (sample/ack) so a cursor never moves backwards
  // on disk. Acquired before mu_ when both are held.
  absl::Mutex cursor_mu_;
  absl::Mutex mu_;
  std::map<std::string, Experiment> experiments_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // Bumped on every committed group; waiting samplers watch it.
  int64_t commits_ ABSL_GUARDED_BY(mu_) = 0;
};

// The RocksDB options and column families ReplayStore opens its database
// with (data, groups, by_prompt, meta after "default"); exposed so that a
// benchmark can run RocksDB directly with identical options.
void MakeRocksOptions(const ReplayStoreOptions& options, rocksdb::DBOptions* db_options,
                      std::vector<rocksdb::ColumnFamilyDescriptor>* column_families);

// Validation shared with the service (exposed for tests).
absl::Status ValidateGroup(const TrajectoryGroup& group, int index,
                           const ReplayStoreOptions& options);

}  // namespace rlmesh
