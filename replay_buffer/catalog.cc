// ReplayStore's in-memory catalog: rebuilt from the groups column family
// and the meta records at Open, looked up and snapshotted under mu_.

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

using replay::AckRange;
using replay::DecodeSummary;
using replay::FromRocks;
using replay::kAckedTag;
using replay::kCursorTag;
using replay::kExpTag;
using replay::Reader;
using replay::Sv;

int64_t ReplayStore::Experiment::visible_limit() const {
  return inflight_seqs.empty() ? next_seq : *inflight_seqs.begin();
}

absl::Status ReplayStore::LoadCatalog() {
  absl::MutexLock lock(&mu_);
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), groups_cf_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const rocksdb::Slice key = it->key();
      const size_t nul = Sv(key).find('\0');
      if (nul == std::string::npos || key.size() != nul + 9) {
        return absl::DataLossError("groups column family holds a malformed key");
      }
      const std::string exp(key.data(), nul);
      int64_t seq;
      Reader(absl::string_view(key.data() + nul + 1, 8)).I64(&seq);
      auto g = std::make_shared<GroupSummary>();
      if (!DecodeSummary(Sv(it->value()), g.get(), nullptr)) {
        return absl::DataLossError(absl::StrCat("group summary experiment=", exp, " seq=", seq));
      }
      g->seq = seq;
      Experiment& e = experiments_[exp];
      e.next_seq = std::max(e.next_seq, seq + 1);
      e.trajectories += g->samples.size();
      e.CountVersions(*g, +1);
      e.bytes += g->bytes;
      e.by_step[{g->step, seq}] = g;
      e.random_index.Add(g);
      e.by_seq[seq] = std::move(g);
    }
    RLMESH_RETURN_IF_ERROR(FromRocks(it->status(), "scanning groups"));
  }
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), meta_cf_));
  for (it->Seek(std::string(1, kAckedTag)); it->Valid() && it->key()[0] == kAckedTag; it->Next()) {
    const std::string key = it->key().ToString();
    const size_t a = key.find('\0', 1);
    const size_t b = a == std::string::npos ? a : key.find('\0', a + 1);
    AckRange r;
    Reader v(Sv(it->value()));
    if (b == std::string::npos || key.size() != b + 9 || !v.I64(&r.to) || !v.I64(&r.groups)) {
      return absl::DataLossError("malformed acked-range record");
    }
    Reader(absl::string_view(key).substr(b + 1)).I64(&r.from);
    Lease l{r.from, r.to, r.groups, absl::InfiniteFuture()};
    experiments_[key.substr(1, a - 1)].consumers[key.substr(a + 1, b - a - 1)].acked[r.from] = l;
  }
  for (it->Seek(std::string(1, kCursorTag)); it->Valid() && it->key()[0] == kCursorTag;
       it->Next()) {
    const std::string key = it->key().ToString();
    const size_t a = key.find('\0', 1);
    Reader v(Sv(it->value()));
    int64_t next, consumed;
    if (a == std::string::npos || !v.I64(&next) || !v.I64(&consumed)) {
      return absl::DataLossError("malformed cursor record");
    }
    Experiment& e = experiments_[key.substr(1, a - 1)];
    Consumer& c = e.consumers[key.substr(a + 1)];
    c.persisted_next = next;
    c.lease_next = next;
    c.consumed = consumed;
    e.next_seq = std::max(e.next_seq, next);
  }
  for (it->Seek(std::string(1, kExpTag)); it->Valid() && it->key()[0] == kExpTag; it->Next()) {
    const std::string key = it->key().ToString();
    Experiment& e = experiments_[key.substr(1, key.size() - 2)];
    int64_t high = 0;
    if (Reader(Sv(it->value())).I64(&high)) e.next_seq = std::max(e.next_seq, high);
  }
  RLMESH_RETURN_IF_ERROR(FromRocks(it->status(), "scanning meta"));
  for (auto& [exp, e] : experiments_) {
    for (auto& [name, c] : e.consumers) {
      for (auto& [from, r] : c.acked) e.next_seq = std::max(e.next_seq, r.to);
    }
    RLMESH_LOG(INFO) << "loaded experiment=" << exp << " groups=" << e.by_seq.size()
                     << " trajectories=" << e.trajectories << " next_seq=" << e.next_seq;
  }
  return absl::OkStatus();
}

ReplayStore::Experiment* ReplayStore::FindExperiment(const std::string& exp) {
  auto it = experiments_.find(exp);
  return it == experiments_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::vector<std::shared_ptr<const ReplayStore::GroupSummary>>>
ReplayStore::SnapshotGroups(const std::string& exp) {
  absl::MutexLock lock(&mu_);
  Experiment* e = FindExperiment(exp);
  if (e == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("experiment_id '", exp, "' is unknown"));
  }
  std::vector<std::shared_ptr<const GroupSummary>> out;
  out.reserve(e->by_step.size());
  for (const auto& [key, g] : e->by_step) out.push_back(g);
  return out;
}

}  // namespace rlmesh
