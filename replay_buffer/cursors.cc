// ReplayStore's FIFO consumer cursors: persisting a cursor, and
// acknowledging a lease (out-of-order acks are kept until contiguous).

#include "replay_buffer/store.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "replay_buffer/codec.h"
#include "replay_buffer/filter.h"
#include "replay_buffer/format.h"
#include "replay_buffer/tokens.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

namespace rlmesh {

using replay::AckedKey;
using replay::AckRange;
using replay::Be64;
using replay::CheckId;
using replay::DecodeAckToken;
using replay::FromRocks;
using replay::kCursorTag;
using replay::MetaKey;
using replay::PutBe64;

absl::Status ReplayStore::PersistCursor(const std::string& exp, const std::string& consumer,
                                        int64_t next, int64_t consumed) {
  std::string v;
  PutBe64(&v, next);
  PutBe64(&v, consumed);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return WriteError(db_->Put(wo, meta_cf_, MetaKey(kCursorTag, exp, consumer), v), "persisting cursor");
}

absl::Status ReplayStore::AckSample(const AckSampleRequest& request) {
  const std::string& exp = request.experiment_id();
  RLMESH_RETURN_IF_ERROR(CheckId(exp, "experiment_id", true));
  RLMESH_RETURN_IF_ERROR(CheckId(request.consumer_id(), "consumer_id", true));
  RLMESH_ASSIGN_OR_RETURN(AckRange range,
                          DecodeAckToken(exp, request.consumer_id(), request.ack_token()));
  absl::MutexLock cursor_lock(&cursor_mu_);
  Consumer* c;
  {
    absl::MutexLock lock(&mu_);
    Experiment* e = FindExperiment(exp);
    if (e == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("experiment_id '", exp, "' is unknown"));
    }
    if (range.to > e->next_seq) {
      return absl::InvalidArgumentError("ack_token refers to groups this store never handed out");
    }
    c = &e->consumers[request.consumer_id()];
    if (range.to <= c->persisted_next) return absl::OkStatus();  // already acked
  }
  // Merge the range with earlier out-of-order acks; persist the cursor and
  // the remaining out-of-order ranges in one synced batch.
  std::map<int64_t, Lease> acked = c->acked;
  acked[range.from] = Lease{range.from, range.to, range.groups, absl::InfiniteFuture()};
  int64_t next = c->persisted_next;
  int64_t consumed = c->consumed;
  rocksdb::WriteBatch batch;
  batch.Put(meta_cf_, AckedKey(exp, request.consumer_id(), range.from),
            Be64(range.to) + Be64(range.groups));
  while (!acked.empty() && acked.begin()->first <= next) {
    next = std::max(next, acked.begin()->second.to);
    consumed += acked.begin()->second.groups;
    batch.Delete(meta_cf_, AckedKey(exp, request.consumer_id(), acked.begin()->first));
    acked.erase(acked.begin());
  }
  std::string v = Be64(next) + Be64(consumed);
  batch.Put(meta_cf_, MetaKey(kCursorTag, exp, request.consumer_id()), v);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  RLMESH_RETURN_IF_ERROR(WriteError(db_->Write(wo, &batch), "persisting ack"));
  absl::MutexLock lock(&mu_);
  c->acked = std::move(acked);
  c->persisted_next = next;
  c->consumed = consumed;
  c->lease_next = std::max(c->lease_next, next);
  for (auto it = c->leases.begin(); it != c->leases.end();) {
    const bool done = it->second.to <= next || (it->first == range.from && it->second.to == range.to);
    it = done ? c->leases.erase(it) : std::next(it);
  }
  return absl::OkStatus();
}

}  // namespace rlmesh
