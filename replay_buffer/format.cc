#include "replay_buffer/format.h"

#include <cstdarg>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "replay_buffer/codec.h"
#include "replay_buffer/store.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/table.h"

namespace rlmesh {
namespace replay {

absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsIOError() || s.IsBusy() || s.IsTryAgain()) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

std::string ExpPrefix(absl::string_view exp) { return absl::StrCat(exp, absl::string_view("\0", 1)); }

std::string DataGroupPrefix(absl::string_view exp, int64_t step, int64_t seq) {
  std::string k = ExpPrefix(exp);
  PutBe64(&k, step);
  PutBe64(&k, seq);
  return k;
}
std::string DataKey(absl::string_view exp, int64_t step, int64_t seq, int32_t sample) {
  std::string k = DataGroupPrefix(exp, step, seq);
  PutBe32(&k, sample);
  return k;
}
std::string GroupKey(absl::string_view exp, int64_t seq) {
  std::string k = ExpPrefix(exp);
  PutBe64(&k, seq);
  return k;
}
std::string PromptKey(absl::string_view exp, absl::string_view prompt, int64_t step, int64_t seq) {
  std::string k = absl::StrCat(ExpPrefix(exp), prompt, absl::string_view("\0", 1));
  PutBe64(&k, step);
  PutBe64(&k, seq);
  return k;
}
std::string MetaKey(char tag, absl::string_view exp, absl::string_view rest) {
  std::string k(1, tag);
  absl::StrAppend(&k, exp, absl::string_view("\0", 1), rest);
  return k;
}
std::string AckedKey(absl::string_view exp, absl::string_view consumer, int64_t from) {
  std::string k = MetaKey(kAckedTag, exp, consumer);
  k.push_back('\0');
  PutBe64(&k, from);
  return k;
}
std::string Be64(int64_t v) {
  std::string s;
  PutBe64(&s, v);
  return s;
}

std::string EncodeSummary(const GroupSummary& g, const TrajectoryGroup& group) {
  std::string v;
  PutBe64(&v, g.step);
  PutBe64(&v, g.bytes);
  PutBytes(&v, g.group_id);
  PutBytes(&v, g.prompt_id);
  PutBe32(&v, g.samples.size());
  for (const auto& s : g.samples) {
    PutDouble(&v, s.reward);
    PutBe64(&v, s.policy_version);
    PutBe32(&v, s.response_length);
    PutBe32(&v, s.finish_reason);
  }
  for (const auto& t : group.samples()) PutBytes(&v, t.trajectory_id());
  return v;
}

bool DecodeSummary(absl::string_view v, GroupSummary* g,
                   std::vector<std::string>* trajectory_ids) {
  Reader r(v);
  uint32_t n;
  if (!r.I64(&g->step) || !r.I64(&g->bytes) || !r.Bytes(&g->group_id) ||
      !r.Bytes(&g->prompt_id) || !r.Be32(&n) || n > (1u << 24)) {
    return false;
  }
  g->samples.resize(n);
  for (auto& s : g->samples) {
    uint32_t len, finish;
    if (!r.Double(&s.reward) || !r.I64(&s.policy_version) || !r.Be32(&len) || !r.Be32(&finish)) {
      return false;
    }
    s.response_length = static_cast<int32_t>(len);
    s.finish_reason = static_cast<int32_t>(finish);
  }
  if (trajectory_ids != nullptr) {
    trajectory_ids->resize(n);
    for (auto& id : *trajectory_ids) {
      if (!r.Bytes(&id)) return false;
    }
  }
  return true;
}

absl::string_view Sv(const rocksdb::Slice& s) { return absl::string_view(s.data(), s.size()); }

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

absl::Status CheckId(const std::string& value, const std::string& field, bool required) {
  if (required && value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (HasNul(value)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " contains a NUL byte"));
  }
  return absl::OkStatus();
}

}  // namespace replay

namespace {

// RocksDB's own messages, warnings and worse, go to the role's log rather
// than to a LOG file inside db_path. On a full disk that file's writer
// fails too, and the next message RocksDB writes to it (the report of the
// failed WAL write) trips an assertion in Debian's build and aborts the
// process; a log on the data disk also keeps filling it.
class RoleLogger : public rocksdb::Logger {
 public:
  RoleLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    char buf[1024];
    std::vsnprintf(buf, sizeof(buf), format, ap);
    RLMESH_LOG(WARNING) << "rocksdb: " << buf;
  }
};

}  // namespace

void MakeRocksOptions(const ReplayStoreOptions& options, rocksdb::DBOptions* db_options,
                      std::vector<rocksdb::ColumnFamilyDescriptor>* column_families) {
  db_options->create_if_missing = true;
  db_options->create_missing_column_families = true;
  db_options->info_log = std::make_shared<RoleLogger>();
  db_options->IncreaseParallelism(2);
  // Several threads committing with sync=true form one write group and share
  // one WAL fsync (RocksDB's group commit).
  db_options->enable_pipelined_write = false;
  // A reopen replays the WAL that no flush has covered yet. The small column
  // families (groups, by_prompt, meta) fill their memtables slowly and would
  // keep every WAL file alive -- by default until the WALs reach four times
  // the memtable budget, gigabytes -- so a restart after a large load
  // replayed all of it (8 s at 1M trajectories). Past this size RocksDB
  // flushes the column families that hold the oldest WAL, which bounds the
  // replay after a crash; a clean close flushes everything (~ReplayStore).
  db_options->max_total_wal_size = 64 << 20;

  auto cache = rocksdb::NewLRUCache(static_cast<size_t>(options.block_cache_bytes));
  auto cf_options = [&](bool blobs, bool point_lookups) {
    rocksdb::ColumnFamilyOptions cf;
    rocksdb::BlockBasedTableOptions table;
    table.block_cache = cache;
    if (point_lookups) table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    cf.compression = rocksdb::kNoCompression;
    if (blobs && options.enable_blob_files) {
      cf.enable_blob_files = true;
      cf.min_blob_size = static_cast<uint64_t>(options.min_blob_size);
      cf.enable_blob_garbage_collection = true;  // Trim frees blob space
    }
    return cf;
  };
  *column_families = {
      {rocksdb::kDefaultColumnFamilyName, cf_options(false, false)},
      {replay::kDataCf, cf_options(true, false)},
      {replay::kGroupsCf, cf_options(false, false)},
      {replay::kPromptCf, cf_options(false, false)},
      {replay::kMetaCf, cf_options(false, true)},
  };
}

}  // namespace rlmesh
