#include "replay_buffer/store.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <random>
#include <unordered_map>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "replay_buffer/codec.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace rlmesh {

using replay::Fingerprint;
using replay::PutBe32;
using replay::PutBe64;
using replay::PutBytes;
using replay::PutDouble;
using replay::Reader;

namespace {

constexpr char kDataCf[] = "data";
constexpr char kGroupsCf[] = "groups";
constexpr char kPromptCf[] = "by_prompt";
constexpr char kMetaCf[] = "meta";
constexpr char kExpTag = 'e';
constexpr char kGroupTag = 'g';
constexpr char kTrajTag = 't';
constexpr char kCursorTag = 'c';
constexpr char kAckedTag = 'a';

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
std::string MetaKey(char tag, absl::string_view exp, absl::string_view rest = {}) {
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

// groups CF value: the summary the catalog keeps, plus trajectory ids (read
// only by Trim, to drop the idempotency keys).
std::string EncodeSummary(const ReplayStore::GroupSummary& g, const TrajectoryGroup& group) {
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

bool DecodeSummary(absl::string_view v, ReplayStore::GroupSummary* g,
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

std::string Dump(const nlohmann::json& j) {
  // Invalid UTF-8 in a decoded text must not abort an export.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

absl::Status CheckId(const std::string& value, const std::string& field, bool required) {
  if (required && value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (HasNul(value)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " contains a NUL byte"));
  }
  return absl::OkStatus();
}

std::string FilterFingerprintInput(const TrajectoryFilter& f) {
  std::string s;
  f.SerializeToString(&s);  // no map fields: deterministic
  return s;
}

// Query page token: position of the next trajectory + which filter it belongs to.
struct PagePos {
  int64_t step = 0;
  int64_t seq = 0;
  int32_t sample = 0;
};

std::string EncodePageToken(const PagePos& p, const TrajectoryFilter& f) {
  std::string raw = "Q1";
  PutBe64(&raw, p.step);
  PutBe64(&raw, p.seq);
  PutBe32(&raw, p.sample);
  PutBe64(&raw, Fingerprint(FilterFingerprintInput(f)));
  PutBe64(&raw, Fingerprint(raw, 0x51));
  return absl::WebSafeBase64Escape(raw);
}

absl::StatusOr<PagePos> DecodePageToken(const std::string& token, const TrajectoryFilter& f) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw) || raw.size() != 2 + 8 + 8 + 4 + 8 + 8 ||
      raw.compare(0, 2, "Q1") != 0) {
    return absl::InvalidArgumentError("page_token is not a token this server issued");
  }
  Reader r(absl::string_view(raw).substr(2));
  PagePos p;
  // The size was checked above, so every read succeeds; the zeros only keep
  // the compiler from warning.
  uint32_t sample = 0;
  uint64_t filter_fp = 0, check = 0;
  r.I64(&p.step);
  r.I64(&p.seq);
  r.Be32(&sample);
  r.Be64(&filter_fp);
  r.Be64(&check);
  p.sample = static_cast<int32_t>(sample);
  if (check != Fingerprint(absl::string_view(raw).substr(0, raw.size() - 8), 0x51)) {
    return absl::InvalidArgumentError("page_token is corrupt (checksum mismatch)");
  }
  if (filter_fp != Fingerprint(FilterFingerprintInput(f))) {
    return absl::InvalidArgumentError("page_token belongs to a different filter");
  }
  return p;
}

struct AckRange {
  int64_t from = 0;
  int64_t to = 0;
  int64_t groups = 0;
};

std::string EncodeAckToken(const std::string& exp, const std::string& consumer, const AckRange& a) {
  std::string raw = "A1";
  PutBe64(&raw, a.from);
  PutBe64(&raw, a.to);
  PutBe64(&raw, a.groups);
  PutBe64(&raw, Fingerprint(absl::StrCat(exp, absl::string_view("\0", 1), consumer,
                                         absl::string_view("\0", 1), raw),
                            0xac));
  return absl::WebSafeBase64Escape(raw);
}

absl::StatusOr<AckRange> DecodeAckToken(const std::string& exp, const std::string& consumer,
                                        const std::string& token) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw) || raw.size() != 2 + 8 * 4 ||
      raw.compare(0, 2, "A1") != 0) {
    return absl::InvalidArgumentError("ack_token is not a token this server issued");
  }
  Reader r(absl::string_view(raw).substr(2));
  AckRange a;
  uint64_t check = 0;
  r.I64(&a.from);
  r.I64(&a.to);
  r.I64(&a.groups);
  r.Be64(&check);
  const absl::string_view body = absl::string_view(raw).substr(0, raw.size() - 8);
  if (check != Fingerprint(absl::StrCat(exp, absl::string_view("\0", 1), consumer,
                                        absl::string_view("\0", 1), body),
                           0xac)) {
    return absl::InvalidArgumentError(
        "ack_token does not belong to this experiment_id/consumer_id or is corrupt");
  }
  if (a.from < 0 || a.to <= a.from || a.groups < 0) {
    return absl::InvalidArgumentError("ack_token holds an invalid range");
  }
  return a;
}

bool SampleMatches(const TrajectoryFilter& f, const ReplayStore::SampleInfo& s) {
  if (s.policy_version < f.min_policy_version()) return false;
  if (f.max_policy_version() > 0 && s.policy_version > f.max_policy_version()) return false;
  if (f.has_reward_range() && (s.reward < f.min_reward() || s.reward > f.max_reward())) {
    return false;
  }
  if (f.finish_reason() != FINISH_REASON_UNSPECIFIED && s.finish_reason != f.finish_reason()) {
    return false;
  }
  return true;
}

absl::Status ValidateFilter(const TrajectoryFilter& f) {
  RLMESH_RETURN_IF_ERROR(CheckId(f.experiment_id(), "filter.experiment_id", true));
  RLMESH_RETURN_IF_ERROR(CheckId(f.prompt_id(), "filter.prompt_id", false));
  if (f.min_step() < 0) return absl::InvalidArgumentError("filter.min_step is negative");
  if (f.max_step() < 0) return absl::InvalidArgumentError("filter.max_step is negative");
  if (f.max_step() > 0 && f.max_step() < f.min_step()) {
    return absl::InvalidArgumentError("filter.max_step is below filter.min_step");
  }
  if (f.max_policy_version() > 0 && f.max_policy_version() < f.min_policy_version()) {
    return absl::InvalidArgumentError("filter.max_policy_version is below filter.min_policy_version");
  }
  if (f.has_reward_range()) {
    if (!std::isfinite(f.min_reward()) || !std::isfinite(f.max_reward())) {
      return absl::InvalidArgumentError("filter.min_reward/max_reward must be finite");
    }
    if (f.max_reward() < f.min_reward()) {
      return absl::InvalidArgumentError("filter.max_reward is below filter.min_reward");
    }
  }
  if (!FinishReason_IsValid(f.finish_reason())) {
    return absl::InvalidArgumentError("filter.finish_reason is not a known value");
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- options

absl::Status ReplayStoreOptions::Validate() const {
  if (db_path.empty()) return absl::InvalidArgumentError("db_path is empty");
  if (min_blob_size < 0) return absl::InvalidArgumentError("min_blob_size is negative");
  if (max_group_bytes <= 0) return absl::InvalidArgumentError("max_group_bytes must be > 0");
  if (max_group_size <= 0) return absl::InvalidArgumentError("max_group_size must be > 0");
  if (max_sample_groups <= 0) return absl::InvalidArgumentError("max_sample_groups must be > 0");
  if (max_query_limit <= 0) return absl::InvalidArgumentError("max_query_limit must be > 0");
  if (ack_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ack_timeout must be > 0");
  }
  if (export_chunk_bytes <= 0) return absl::InvalidArgumentError("export_chunk_bytes must be > 0");
  if (block_cache_bytes < 0) return absl::InvalidArgumentError("block_cache_bytes is negative");
  return absl::OkStatus();
}

// ---------------------------------------------------------------- summaries

int64_t ReplayStore::GroupSummary::min_policy_version() const {
  int64_t v = samples.empty() ? 0 : samples[0].policy_version;
  for (const auto& s : samples) v = std::min(v, s.policy_version);
  return v;
}

bool ReplayStore::GroupSummary::zero_variance() const {
  for (const auto& s : samples) {
    if (s.reward != samples[0].reward) return false;
  }
  return true;
}

double ReplayStore::GroupSummary::reward_variance() const {
  if (samples.empty()) return 0;
  double mean = 0;
  for (const auto& s : samples) mean += s.reward;
  mean /= samples.size();
  double var = 0;
  for (const auto& s : samples) var += (s.reward - mean) * (s.reward - mean);
  return var / samples.size();
}

int64_t ReplayStore::Experiment::visible_limit() const {
  return inflight_seqs.empty() ? next_seq : *inflight_seqs.begin();
}

// ---------------------------------------------------------------- validation

absl::Status ValidateGroup(const TrajectoryGroup& group, int index,
                           const ReplayStoreOptions& options) {
  const std::string p = absl::StrCat("groups[", index, "]");
  RLMESH_RETURN_IF_ERROR(CheckId(group.experiment_id(), p + ".experiment_id", true));
  RLMESH_RETURN_IF_ERROR(CheckId(group.group_id(), p + ".group_id", true));
  RLMESH_RETURN_IF_ERROR(CheckId(group.prompt_id(), p + ".prompt_id", false));
  if (group.step() < 0) return absl::InvalidArgumentError(p + ".step is negative");
  if (group.samples().empty()) return absl::InvalidArgumentError(p + ".samples is empty");
  if (group.samples_size() > options.max_group_size) {
    return absl::InvalidArgumentError(absl::StrCat(p, ".samples has ", group.samples_size(),
                                                   " entries, more than max_group_size ",
                                                   options.max_group_size));
  }
  const int64_t bytes = static_cast<int64_t>(group.ByteSizeLong());
  if (bytes > options.max_group_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(p, " is ", bytes,
                                                   " bytes, more than max_group_bytes ",
                                                   options.max_group_bytes));
  }
  absl::flat_hash_set<std::string> ids;
  for (int j = 0; j < group.samples_size(); ++j) {
    const Trajectory& t = group.samples(j);
    const std::string q = absl::StrCat(p, ".samples[", j, "]");
    RLMESH_RETURN_IF_ERROR(CheckId(t.trajectory_id(), q + ".trajectory_id", true));
    if (!ids.insert(t.trajectory_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(q, ".trajectory_id '", t.trajectory_id(), "' repeats within the group"));
    }
    if (!t.experiment_id().empty() && t.experiment_id() != group.experiment_id()) {
      return absl::InvalidArgumentError(q + ".experiment_id differs from the group's");
    }
    if (!t.group_id().empty() && t.group_id() != group.group_id()) {
      return absl::InvalidArgumentError(q + ".group_id differs from the group's");
    }
    if (!t.prompt_id().empty() && t.prompt_id() != group.prompt_id()) {
      return absl::InvalidArgumentError(q + ".prompt_id differs from the group's");
    }
    if (t.step() != 0 && t.step() != group.step()) {
      return absl::InvalidArgumentError(q + ".step differs from the group's");
    }
    if (t.sample_index() != j) {
      return absl::InvalidArgumentError(
          absl::StrCat(q, ".sample_index is ", t.sample_index(), ", expected ", j));
    }
    if (t.policy_version() < 0) return absl::InvalidArgumentError(q + ".policy_version is negative");
    if (t.loss_mask_size() != t.response_token_ids_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          q, ".loss_mask has ", t.loss_mask_size(), " entries but response_token_ids has ",
          t.response_token_ids_size()));
    }
    if (t.behaviour_logprobs_size() != t.response_token_ids_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          q, ".behaviour_logprobs has ", t.behaviour_logprobs_size(),
          " entries but response_token_ids has ", t.response_token_ids_size()));
    }
    if (!std::isfinite(t.reward())) {
      return absl::InvalidArgumentError(q + ".reward is not finite");
    }
    for (const auto& [name, value] : t.reward_components()) {
      if (!std::isfinite(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat(q, ".reward_components['", name, "'] is not finite"));
      }
    }
    for (int k = 0; k < t.behaviour_logprobs_size(); ++k) {
      if (std::isnan(t.behaviour_logprobs(k))) {
        return absl::InvalidArgumentError(absl::StrCat(q, ".behaviour_logprobs[", k, "] is NaN"));
      }
    }
    if (!FinishReason_IsValid(t.finish_reason())) {
      return absl::InvalidArgumentError(q + ".finish_reason is not a known value");
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- open

ReplayStore::ReplayStore(ReplayStoreOptions options) : options_(std::move(options)) {}

ReplayStore::~ReplayStore() {
  Shutdown();
  if (db_ != nullptr) {
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
    handles_.clear();
    db_->Close();
  }
}

absl::StatusOr<std::unique_ptr<ReplayStore>> ReplayStore::Open(const ReplayStoreOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<ReplayStore> store(new ReplayStore(options));
  RLMESH_RETURN_IF_ERROR(store->OpenDb());
  RLMESH_RETURN_IF_ERROR(store->LoadCatalog());
  return store;
}

void MakeRocksOptions(const ReplayStoreOptions& options, rocksdb::DBOptions* db_options,
                      std::vector<rocksdb::ColumnFamilyDescriptor>* column_families) {
  db_options->create_if_missing = true;
  db_options->create_missing_column_families = true;
  db_options->IncreaseParallelism(2);
  // Several threads committing with sync=true form one write group and share
  // one WAL fsync (RocksDB's group commit).
  db_options->enable_pipelined_write = false;

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
      {kDataCf, cf_options(true, false)},
      {kGroupsCf, cf_options(false, false)},
      {kPromptCf, cf_options(false, false)},
      {kMetaCf, cf_options(false, true)},
  };
}

absl::Status ReplayStore::OpenDb() {
  rocksdb::DBOptions db_options;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  MakeRocksOptions(options_, &db_options, &cfs);
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, options_.db_path, cfs, &handles_, &db);
  RLMESH_RETURN_IF_ERROR(FromRocks(s, absl::StrCat("opening db_path ", options_.db_path)));
  db_.reset(db);
  data_cf_ = handles_[1];
  groups_cf_ = handles_[2];
  prompt_cf_ = handles_[3];
  meta_cf_ = handles_[4];
  return absl::OkStatus();
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
      e.bytes += g->bytes;
      e.by_step[{g->step, seq}] = g;
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

void ReplayStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

ReplayStore::Experiment* ReplayStore::FindExperiment(const std::string& exp) {
  auto it = experiments_.find(exp);
  return it == experiments_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------- put

absl::StatusOr<PutGroupsResponse> ReplayStore::PutGroups(const PutGroupsRequest& request) {
  if (request.groups().empty()) return absl::InvalidArgumentError("groups is empty");
  for (int i = 0; i < request.groups_size(); ++i) {
    RLMESH_RETURN_IF_ERROR(ValidateGroup(request.groups(i), i, options_));
  }
  PutGroupsResponse response;
  for (int i = 0; i < request.groups_size(); ++i) {
    bool duplicate = false;
    absl::Status s = PutOneGroup(request.groups(i), &duplicate);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("groups[", i, "]: ", s.message()));
    }
    if (duplicate) {
      response.set_duplicates(response.duplicates() + 1);
    } else {
      response.set_written(response.written() + 1);
    }
  }
  return response;
}

absl::Status ReplayStore::PutOneGroup(const TrajectoryGroup& group, bool* duplicate) {
  const std::string& exp = group.experiment_id();
  // Reserve the group id and every trajectory id so that two concurrent
  // writers of the same group (a retried call) cannot both write it.
  std::vector<std::string> reserved;
  reserved.push_back(absl::StrCat("g", group.group_id()));
  for (const auto& t : group.samples()) reserved.push_back(absl::StrCat("t", t.trajectory_id()));
  int64_t seq;
  {
    absl::MutexLock lock(&mu_);
    Experiment* e = &experiments_[exp];
    auto free = [&]() {
      for (const auto& r : reserved) {
        if (e->inflight_ids.contains(r)) return false;
      }
      return true;
    };
    mu_.Await(absl::Condition(&free));
    for (const auto& r : reserved) e->inflight_ids.insert(r);
    seq = e->next_seq++;
    e->inflight_seqs.insert(seq);
  }
  auto release = [&](std::shared_ptr<const GroupSummary> committed) {
    absl::MutexLock lock(&mu_);
    Experiment& e = experiments_[exp];
    for (const auto& r : reserved) e.inflight_ids.erase(r);
    e.inflight_seqs.erase(seq);
    if (committed != nullptr) {
      e.trajectories += committed->samples.size();
      e.bytes += committed->bytes;
      e.by_step[{committed->step, seq}] = committed;
      e.by_seq[seq] = std::move(committed);
    }
    ++commits_;  // a visible_limit may have moved even without a commit
  };

  // Idempotency: a stored group id or trajectory id decides.
  std::vector<std::string> meta_keys;
  meta_keys.push_back(MetaKey(kGroupTag, exp, group.group_id()));
  for (const auto& t : group.samples()) meta_keys.push_back(MetaKey(kTrajTag, exp, t.trajectory_id()));
  std::vector<rocksdb::Slice> key_slices(meta_keys.begin(), meta_keys.end());
  std::vector<rocksdb::ColumnFamilyHandle*> cfs(meta_keys.size(), meta_cf_);
  std::vector<std::string> values;
  std::vector<rocksdb::Status> found =
      db_->MultiGet(rocksdb::ReadOptions(), cfs, key_slices, &values);
  int present = 0;
  for (size_t k = 0; k < found.size(); ++k) {
    if (found[k].ok()) {
      ++present;
    } else if (!found[k].IsNotFound()) {
      release(nullptr);
      return FromRocks(found[k], "idempotency lookup");
    }
  }
  if (present > 0) {
    const bool same = present == static_cast<int>(found.size()) &&
                      std::all_of(values.begin(), values.end(),
                                  [&](const std::string& v) { return v == values[0]; });
    release(nullptr);
    if (same) {
      *duplicate = true;
      return absl::OkStatus();
    }
    if (found[0].ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group_id '", group.group_id(), "' is already stored with other trajectory ids"));
    }
    for (size_t k = 1; k < found.size(); ++k) {
      if (found[k].ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "samples[", k - 1, "].trajectory_id '", group.samples(k - 1).trajectory_id(),
            "' is already stored in another group"));
      }
    }
  }

  auto summary = std::make_shared<GroupSummary>();
  summary->seq = seq;
  summary->step = group.step();
  summary->group_id = group.group_id();
  summary->prompt_id = group.prompt_id();
  rocksdb::WriteBatch batch;
  std::string value;
  for (int j = 0; j < group.samples_size(); ++j) {
    Trajectory t = group.samples(j);
    t.set_experiment_id(exp);
    t.set_group_id(group.group_id());
    t.set_prompt_id(group.prompt_id());
    t.set_step(group.step());
    t.SerializeToString(&value);
    summary->bytes += value.size();
    summary->samples.push_back({t.reward(), t.policy_version(), t.response_token_ids_size(),
                                static_cast<int32_t>(t.finish_reason())});
    batch.Put(data_cf_, DataKey(exp, group.step(), seq, j), value);
    batch.Put(meta_cf_, MetaKey(kTrajTag, exp, t.trajectory_id()), Be64(seq));
  }
  batch.Put(groups_cf_, GroupKey(exp, seq), EncodeSummary(*summary, group));
  batch.Put(prompt_cf_, PromptKey(exp, group.prompt_id(), group.step(), seq), "");
  batch.Put(meta_cf_, MetaKey(kGroupTag, exp, group.group_id()), Be64(seq));
  batch.Put(meta_cf_, MetaKey(kExpTag, exp), Be64(seq + 1));
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  rocksdb::Status s = db_->Write(wo, &batch);
  if (!s.ok()) {
    release(nullptr);
    return FromRocks(s, "writing group");
  }
  release(std::move(summary));
  return absl::OkStatus();
}

// ---------------------------------------------------------------- read helpers

absl::StatusOr<TrajectoryGroup> ReplayStore::ReadGroup(const std::string& exp,
                                                       const GroupSummary& g) {
  TrajectoryGroup group;
  group.set_group_id(g.group_id);
  group.set_experiment_id(exp);
  group.set_step(g.step);
  group.set_prompt_id(g.prompt_id);
  const std::string lower = DataGroupPrefix(exp, g.step, g.seq);
  const std::string upper = DataGroupPrefix(exp, g.step, g.seq + 1);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, data_cf_));
  for (it->Seek(lower); it->Valid(); it->Next()) {
    if (!group.add_samples()->ParseFromArray(it->value().data(), it->value().size())) {
      return absl::DataLossError(absl::StrCat("trajectory record experiment=", exp,
                                              " seq=", g.seq, " is unreadable"));
    }
  }
  RLMESH_RETURN_IF_ERROR(FromRocks(it->status(), "reading group"));
  if (group.samples_size() != static_cast<int>(g.samples.size())) {
    // Trimmed between the catalog lookup and this read.
    return absl::NotFoundError(absl::StrCat("group seq=", g.seq, " was trimmed"));
  }
  return group;
}

// ---------------------------------------------------------------- sample

absl::StatusOr<SampleGroupsResponse> ReplayStore::SampleGroups(
    const SampleGroupsRequest& request, absl::Time deadline,
    const std::function<bool()>& cancelled) {
  const std::string& exp = request.experiment_id();
  RLMESH_RETURN_IF_ERROR(CheckId(exp, "experiment_id", true));
  const bool fifo = request.mode() == SAMPLE_FIFO;
  if (!SampleMode_IsValid(request.mode())) {
    return absl::InvalidArgumentError("mode is not a known value");
  }
  RLMESH_RETURN_IF_ERROR(CheckId(request.consumer_id(), "consumer_id", fifo));
  if (request.num_groups() <= 0 || request.num_groups() > options_.max_sample_groups) {
    return absl::InvalidArgumentError(absl::StrCat("num_groups must be in [1, ",
                                                   options_.max_sample_groups, "], got ",
                                                   request.num_groups()));
  }
  if (request.require_ack() && !fifo) {
    return absl::InvalidArgumentError("require_ack is only meaningful with mode SAMPLE_FIFO");
  }
  const size_t want = request.num_groups();
  auto accept = [&](const GroupSummary& g) {
    if (g.min_policy_version() < request.min_policy_version()) return false;
    if (request.skip_zero_variance() && g.zero_variance()) return false;
    return true;
  };

  while (true) {
    int64_t seen_commits;
    // FIFO holds cursor_mu_ from selection to the cursor update so two calls
    // of one consumer cannot hand out the same groups.
    std::optional<absl::MutexLock> cursor_lock;
    if (fifo) cursor_lock.emplace(&cursor_mu_);
    std::vector<std::shared_ptr<const GroupSummary>> picked;
    int skipped = 0;
    int64_t end_seq = 0;
    Consumer* consumer = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) return absl::UnavailableError("replay store is shutting down");
      seen_commits = commits_;
      Experiment* e = FindExperiment(exp);
      if (e != nullptr && fifo) {
        consumer = &e->consumers[request.consumer_id()];
        const absl::Time now = absl::Now();
        bool expired = false;
        for (const auto& [from, lease] : consumer->leases) expired |= lease.expires <= now;
        if (expired) {
          RLMESH_LOG(INFO) << "experiment=" << exp << " consumer=" << request.consumer_id()
                           << " unacked leases expired; redelivering from seq="
                           << consumer->persisted_next;
          consumer->leases.clear();
          consumer->lease_next = consumer->persisted_next;
        }
        const int64_t limit = e->visible_limit();
        auto acked = consumer->acked.begin();
        end_seq = consumer->lease_next;
        for (auto it = e->by_seq.lower_bound(consumer->lease_next);
             it != e->by_seq.end() && it->first < limit && picked.size() < want; ++it) {
          while (acked != consumer->acked.end() && acked->second.to <= it->first) ++acked;
          end_seq = it->first + 1;
          if (acked != consumer->acked.end() && acked->first <= it->first) continue;
          if (accept(*it->second)) {
            picked.push_back(it->second);
          } else {
            ++skipped;
          }
        }
      } else if (e != nullptr) {
        std::vector<std::shared_ptr<const GroupSummary>> candidates;
        for (const auto& [seq, g] : e->by_seq) {
          if (accept(*g)) candidates.push_back(g);
        }
        skipped = static_cast<int>(e->by_seq.size() - candidates.size());
        if (candidates.size() >= want) {
          std::mt19937_64 rng(request.seed());
          if (request.mode() == SAMPLE_UNIFORM) {
            std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
            for (size_t i = 0; i < want; ++i) picked.push_back(candidates[pick(rng)]);
          } else {
            // Priority = reward variance; a small floor keeps zero-variance
            // groups reachable unless skip_zero_variance drops them.
            std::vector<double> weights;
            weights.reserve(candidates.size());
            for (const auto& g : candidates) weights.push_back(g->reward_variance() + 1e-6);
            std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
            for (size_t i = 0; i < want; ++i) picked.push_back(candidates[pick(rng)]);
          }
        }
      }
    }
    if (picked.size() >= want) {
      SampleGroupsResponse response;
      response.set_skipped(skipped);
      for (const auto& g : picked) {
        absl::StatusOr<TrajectoryGroup> group = ReadGroup(exp, *g);
        if (absl::IsNotFound(group.status())) continue;  // trimmed meanwhile
        RLMESH_RETURN_IF_ERROR(group.status());
        *response.add_groups() = *std::move(group);
      }
      if (fifo) {
        const int64_t from = consumer->lease_next;
        if (request.require_ack()) {
          Lease lease{from, end_seq, static_cast<int64_t>(picked.size()),
                      absl::Now() + options_.ack_timeout};
          absl::MutexLock lock(&mu_);
          consumer->leases[from] = lease;
          consumer->lease_next = end_seq;
          response.set_ack_token(EncodeAckToken(exp, request.consumer_id(),
                                                {from, end_seq, lease.groups}));
        } else {
          const int64_t consumed = consumer->consumed + static_cast<int64_t>(picked.size());
          RLMESH_RETURN_IF_ERROR(
              PersistCursor(exp, request.consumer_id(), end_seq, consumed));
          absl::MutexLock lock(&mu_);
          consumer->persisted_next = end_seq;
          consumer->lease_next = end_seq;
          consumer->consumed = consumed;
        }
      }
      return response;
    }
    cursor_lock.reset();
    // Not enough yet: wait for the next commit, in short slices so that a
    // cancelled call or a shutdown is noticed.
    absl::MutexLock lock(&mu_);
    while (commits_ == seen_commits && !shutdown_) {
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "only ", picked.size(), " of ", want, " requested groups match in experiment_id '",
            exp, "' (", skipped, " skipped by filters); nothing consumed"));
      }
      if (cancelled && cancelled()) return absl::CancelledError("caller went away");
      auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return commits_ != seen_commits || shutdown_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&changed),
                            std::min(deadline, now + absl::Milliseconds(100)));
    }
  }
}

absl::Status ReplayStore::PersistCursor(const std::string& exp, const std::string& consumer,
                                        int64_t next, int64_t consumed) {
  std::string v;
  PutBe64(&v, next);
  PutBe64(&v, consumed);
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Put(wo, meta_cf_, MetaKey(kCursorTag, exp, consumer), v),
                   "persisting cursor");
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
  RLMESH_RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "persisting ack"));
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

// ---------------------------------------------------------------- query

namespace {

struct StepAcc {
  int64_t count = 0;
  int64_t groups = 0;
  int64_t zero_var_groups = 0;
  double sum = 0;
  double sum_sq = 0;
  int64_t len_sum = 0;
  int64_t len_min = INT64_MAX;
  int64_t len_max = 0;
  std::map<std::string, bool> prompt_passed;
};

void AddAggregates(const std::map<int64_t, StepAcc>& acc, QueryResponse* response) {
  for (const auto& [step, a] : acc) {
    StepAggregate* out = response->add_aggregates();
    out->set_step(step);
    out->set_count(a.count);
    out->set_groups(a.groups);
    const double mean = a.count ? a.sum / a.count : 0;
    out->set_reward_mean(mean);
    out->set_reward_std(a.count ? std::sqrt(std::max(0.0, a.sum_sq / a.count - mean * mean)) : 0);
    int64_t passed = 0;
    for (const auto& [p, ok] : a.prompt_passed) passed += ok;
    out->set_pass_at_k(a.prompt_passed.empty() ? 0 : double(passed) / a.prompt_passed.size());
    out->set_zero_variance_rate(a.groups ? double(a.zero_var_groups) / a.groups : 0);
    out->set_length_mean(a.count ? double(a.len_sum) / a.count : 0);
    out->set_length_min(a.count ? a.len_min : 0);
    out->set_length_max(a.len_max);
  }
}

}  // namespace

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

absl::StatusOr<QueryResponse> ReplayStore::Query(const QueryRequest& request) {
  const TrajectoryFilter& f = request.filter();
  RLMESH_RETURN_IF_ERROR(ValidateFilter(f));
  if (request.limit() < 0 || request.limit() > options_.max_query_limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit must be in [0, ", options_.max_query_limit, "], got ", request.limit()));
  }
  const int limit = request.limit() == 0 ? 100 : request.limit();
  PagePos start;
  start.step = f.min_step();
  if (!request.page_token().empty()) {
    RLMESH_ASSIGN_OR_RETURN(start, DecodePageToken(request.page_token(), f));
  }
  const std::string& exp = f.experiment_id();
  const int64_t max_step = f.max_step() > 0 ? f.max_step() : INT64_MAX;
  const bool by_body = !f.text_contains().empty();

  // Candidate groups in (step, seq) order: from the prompt index when a
  // prompt is given, else the catalog's step order.
  std::vector<std::shared_ptr<const GroupSummary>> groups;
  {
    absl::MutexLock lock(&mu_);
    Experiment* e = FindExperiment(exp);
    if (e == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("filter.experiment_id '", exp, "' is unknown"));
    }
    const int64_t from_step = request.with_aggregates() ? f.min_step() : start.step;
    if (!f.prompt_id().empty()) {
      const std::string prefix = absl::StrCat(ExpPrefix(exp), f.prompt_id(),
                                              absl::string_view("\0", 1));
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), prompt_cf_));
      std::string seek = prefix;
      PutBe64(&seek, from_step);
      for (it->Seek(seek); it->Valid() && it->key().starts_with(prefix); it->Next()) {
        Reader r(Sv(it->key()).substr(prefix.size()));
        int64_t step, seq;
        if (!r.I64(&step) || !r.I64(&seq)) return absl::DataLossError("malformed prompt index key");
        if (step > max_step) break;
        auto g = e->by_step.find({step, seq});
        if (g != e->by_step.end()) groups.push_back(g->second);
      }
      RLMESH_RETURN_IF_ERROR(FromRocks(it->status(), "scanning prompt index"));
    } else {
      // Without aggregates or a text filter a page needs only limit + 1
      // matching samples: stop collecting there, so a query costs O(page),
      // not O(experiment).
      const bool bounded = !request.with_aggregates() && !by_body;
      int64_t matched = 0;
      for (auto it = e->by_step.lower_bound({from_step, 0});
           it != e->by_step.end() && it->first.first <= max_step; ++it) {
        if (bounded) {
          if (it->first < std::make_pair(start.step, start.seq)) continue;
          for (const auto& s : it->second->samples) matched += SampleMatches(f, s);
          if (matched > limit + start.sample) {
            groups.push_back(it->second);
            break;
          }
        }
        groups.push_back(it->second);
      }
    }
  }

  QueryResponse response;
  std::map<int64_t, StepAcc> acc;
  std::vector<std::pair<std::shared_ptr<const GroupSummary>, std::vector<int>>> page;
  int page_count = 0;
  bool page_full = false;
  for (const auto& g : groups) {
    const bool in_page_range =
        std::make_tuple(g->step, g->seq) >= std::make_tuple(start.step, start.seq);
    std::vector<int> hits;
    for (size_t j = 0; j < g->samples.size(); ++j) {
      if (SampleMatches(f, g->samples[j])) hits.push_back(static_cast<int>(j));
    }
    if (hits.empty()) continue;
    std::optional<TrajectoryGroup> body;
    if (by_body) {
      absl::StatusOr<TrajectoryGroup> read = ReadGroup(exp, *g);
      if (absl::IsNotFound(read.status())) continue;
      RLMESH_RETURN_IF_ERROR(read.status());
      std::vector<int> kept;
      for (int j : hits) {
        if (read->samples(j).response_text().find(f.text_contains()) != std::string::npos) {
          kept.push_back(j);
        }
      }
      hits = std::move(kept);
      if (hits.empty()) continue;
      body = *std::move(read);
    }
    if (request.with_aggregates()) {
      StepAcc& a = acc[g->step];
      a.groups += 1;
      a.zero_var_groups += g->zero_variance();
      bool& passed = a.prompt_passed[g->prompt_id.empty() ? g->group_id : g->prompt_id];
      for (int j : hits) {
        const SampleInfo& s = g->samples[j];
        a.count += 1;
        a.sum += s.reward;
        a.sum_sq += s.reward * s.reward;
        a.len_sum += s.response_length;
        a.len_min = std::min<int64_t>(a.len_min, s.response_length);
        a.len_max = std::max<int64_t>(a.len_max, s.response_length);
        passed = passed || s.reward >= 1.0;
      }
    }
    if (!in_page_range || page_full) {
      if (page_full && !request.with_aggregates()) break;
      continue;
    }
    std::vector<int> taken;
    for (int j : hits) {
      const bool same_group_as_token = g->step == start.step && g->seq == start.seq;
      if (same_group_as_token && j < start.sample) continue;
      if (page_count == limit) {
        response.set_next_page_token(EncodePageToken({g->step, g->seq, j}, f));
        page_full = true;
        break;
      }
      taken.push_back(j);
      ++page_count;
    }
    if (!taken.empty()) page.emplace_back(g, std::move(taken));
    if (page_full && !request.with_aggregates()) break;
  }
  // Read the page's bodies (already filtered by the catalog).
  for (const auto& [g, samples] : page) {
    std::vector<std::string> keys;
    for (int j : samples) keys.push_back(DataKey(exp, g->step, g->seq, j));
    std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
    std::vector<rocksdb::ColumnFamilyHandle*> cfs(keys.size(), data_cf_);
    std::vector<std::string> values;
    std::vector<rocksdb::Status> st = db_->MultiGet(rocksdb::ReadOptions(), cfs, slices, &values);
    for (size_t k = 0; k < st.size(); ++k) {
      if (st[k].IsNotFound()) continue;  // trimmed meanwhile
      RLMESH_RETURN_IF_ERROR(FromRocks(st[k], "reading trajectory"));
      if (!response.add_trajectories()->ParseFromString(values[k])) {
        return absl::DataLossError("stored trajectory is unreadable");
      }
    }
  }
  if (request.with_aggregates()) AddAggregates(acc, &response);
  return response;
}

// ---------------------------------------------------------------- stats

absl::StatusOr<StatsResponse> ReplayStore::Stats(const StatsRequest& request) {
  RLMESH_RETURN_IF_ERROR(CheckId(request.experiment_id(), "experiment_id", false));
  StatsResponse response;
  absl::MutexLock cursor_lock(&cursor_mu_);
  absl::MutexLock lock(&mu_);
  if (!request.experiment_id().empty() && FindExperiment(request.experiment_id()) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("experiment_id '", request.experiment_id(), "' is unknown"));
  }
  for (const auto& [exp, e] : experiments_) {
    if (!request.experiment_id().empty() && exp != request.experiment_id()) continue;
    ExperimentStats* s = response.add_experiments();
    s->set_experiment_id(exp);
    s->set_groups(e.by_seq.size());
    s->set_trajectories(e.trajectories);
    s->set_bytes(e.bytes);
    if (!e.by_step.empty()) {
      s->set_min_step(e.by_step.begin()->first.first);
      s->set_max_step(e.by_step.rbegin()->first.first);
      int64_t lo = INT64_MAX, hi = 0;
      for (const auto& [seq, g] : e.by_seq) {
        for (const auto& x : g->samples) {
          lo = std::min(lo, x.policy_version);
          hi = std::max(hi, x.policy_version);
        }
      }
      s->set_min_policy_version(lo);
      s->set_max_policy_version(hi);
    }
    for (const auto& [name, c] : e.consumers) (*s->mutable_consumed())[name] = c.consumed;
  }
  return response;
}

// ---------------------------------------------------------------- trim

absl::StatusOr<TrimResponse> ReplayStore::Trim(const TrimRequest& request) {
  const std::string& exp = request.experiment_id();
  RLMESH_RETURN_IF_ERROR(CheckId(exp, "experiment_id", true));
  if (request.keep_steps() < 0) return absl::InvalidArgumentError("keep_steps is negative");
  if (request.max_bytes() < 0) return absl::InvalidArgumentError("max_bytes is negative");
  std::vector<std::shared_ptr<const GroupSummary>> drop;
  int64_t next_seq;
  {
    absl::MutexLock lock(&mu_);
    Experiment* e = FindExperiment(exp);
    if (e == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("experiment_id '", exp, "' is unknown"));
    }
    next_seq = e->next_seq;
    std::map<int64_t, int64_t> step_bytes;  // step -> bytes
    for (const auto& [key, g] : e->by_step) step_bytes[key.first] += g->bytes;
    int64_t cut = INT64_MIN;  // drop steps < cut
    if (request.keep_steps() > 0 && static_cast<int64_t>(step_bytes.size()) > request.keep_steps()) {
      cut = std::next(step_bytes.begin(), step_bytes.size() - request.keep_steps())->first;
    }
    if (request.max_bytes() > 0) {
      int64_t total = e->bytes;
      for (const auto& [step, bytes] : step_bytes) {
        if (step < cut) {
          total -= bytes;
          continue;
        }
        if (total <= request.max_bytes()) break;
        total -= bytes;
        cut = step + 1;
      }
    }
    for (auto it = e->by_step.begin(); it != e->by_step.end() && it->first.first < cut; ++it) {
      drop.push_back(it->second);
    }
  }
  TrimResponse response;
  if (drop.empty()) return response;
  rocksdb::WriteBatch batch;
  for (const auto& g : drop) {
    std::string value;
    RLMESH_RETURN_IF_ERROR(
        FromRocks(db_->Get(rocksdb::ReadOptions(), groups_cf_, GroupKey(exp, g->seq), &value),
                  "reading group summary"));
    GroupSummary full;
    std::vector<std::string> ids;
    if (!DecodeSummary(value, &full, &ids)) return absl::DataLossError("group summary is corrupt");
    batch.DeleteRange(data_cf_, DataGroupPrefix(exp, g->step, g->seq),
                      DataGroupPrefix(exp, g->step, g->seq + 1));
    batch.Delete(groups_cf_, GroupKey(exp, g->seq));
    batch.Delete(prompt_cf_, PromptKey(exp, g->prompt_id, g->step, g->seq));
    batch.Delete(meta_cf_, MetaKey(kGroupTag, exp, g->group_id));
    for (const auto& id : ids) batch.Delete(meta_cf_, MetaKey(kTrajTag, exp, id));
    response.set_groups_removed(response.groups_removed() + 1);
    response.set_trajectories_removed(response.trajectories_removed() + g->samples.size());
  }
  // Remember the sequence high-water mark so a restart never reuses a seq
  // a FIFO cursor has passed.
  batch.Put(meta_cf_, MetaKey(kExpTag, exp), Be64(next_seq));
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  RLMESH_RETURN_IF_ERROR(FromRocks(db_->Write(wo, &batch), "trimming"));
  absl::MutexLock lock(&mu_);
  Experiment& e = experiments_[exp];
  for (const auto& g : drop) {
    if (e.by_seq.erase(g->seq) == 0) continue;
    e.by_step.erase({g->step, g->seq});
    e.trajectories -= g->samples.size();
    e.bytes -= g->bytes;
  }
  RLMESH_LOG(INFO) << "trim experiment=" << exp << " groups_removed=" << response.groups_removed();
  return response;
}

// ---------------------------------------------------------------- export

absl::Status ReplayStore::Export(const ExportRequest& request,
                                 const std::function<bool(ExportChunk&)>& sink) {
  const TrajectoryFilter& f = request.filter();
  RLMESH_RETURN_IF_ERROR(ValidateFilter(f));
  if (!ExportFormat_IsValid(request.format())) {
    return absl::InvalidArgumentError("format is not a known value");
  }
  const std::string& exp = f.experiment_id();
  RLMESH_ASSIGN_OR_RETURN(auto all, SnapshotGroups(exp));
  const int64_t max_step = f.max_step() > 0 ? f.max_step() : INT64_MAX;

  ExportChunk chunk;
  std::string* out = chunk.mutable_jsonl();
  auto emit = [&](const std::string& line) -> absl::Status {
    out->append(line);
    out->push_back('\n');
    chunk.set_records(chunk.records() + 1);
    if (static_cast<int64_t>(out->size()) >= options_.export_chunk_bytes) {
      if (!sink(chunk)) return absl::CancelledError("export receiver went away");
      chunk.Clear();
      out = chunk.mutable_jsonl();
    }
    return absl::OkStatus();
  };
  auto matches = [&](const GroupSummary& g, const Trajectory& t, int j) {
    return SampleMatches(f, g.samples[j]) &&
           (f.prompt_id().empty() || g.prompt_id == f.prompt_id()) &&
           (f.text_contains().empty() ||
            t.response_text().find(f.text_contains()) != std::string::npos);
  };
  auto ids = [](const google::protobuf::RepeatedField<int32_t>& r) {
    return std::vector<int32_t>(r.begin(), r.end());
  };

  // SFT picks the best completion per prompt over all matched groups.
  std::map<std::string, std::pair<double, Trajectory>> best_per_prompt;
  std::vector<std::string> prompt_order;
  for (const auto& g : all) {
    if (g->step < f.min_step() || g->step > max_step) continue;
    if (!f.prompt_id().empty() && g->prompt_id != f.prompt_id()) continue;
    absl::StatusOr<TrajectoryGroup> group = ReadGroup(exp, *g);
    if (absl::IsNotFound(group.status())) continue;
    RLMESH_RETURN_IF_ERROR(group.status());
    std::vector<const Trajectory*> hits;
    for (int j = 0; j < group->samples_size(); ++j) {
      if (matches(*g, group->samples(j), j)) hits.push_back(&group->samples(j));
    }
    if (hits.empty()) continue;
    if (request.format() == EXPORT_TRAJECTORIES) {
      google::protobuf::util::JsonPrintOptions jo;
      jo.preserve_proto_field_names = true;
      for (const Trajectory* t : hits) {
        std::string line;
        if (!google::protobuf::util::MessageToJsonString(*t, &line, jo).ok()) {
          return absl::InternalError("could not encode a trajectory as JSON");
        }
        RLMESH_RETURN_IF_ERROR(emit(line));
      }
    } else if (request.format() == EXPORT_DPO) {
      const Trajectory* best = hits[0];
      const Trajectory* worst = hits[0];
      for (const Trajectory* t : hits) {
        if (t->reward() > best->reward()) best = t;
        if (t->reward() < worst->reward()) worst = t;
      }
      if (best->reward() == worst->reward()) continue;
      nlohmann::json j = {{"prompt_id", g->prompt_id},
                          {"group_id", g->group_id},
                          {"step", g->step},
                          {"prompt_token_ids", ids(best->prompt_token_ids())},
                          {"chosen_token_ids", ids(best->response_token_ids())},
                          {"rejected_token_ids", ids(worst->response_token_ids())},
                          {"chosen_reward", best->reward()},
                          {"rejected_reward", worst->reward()},
                          {"chosen_trajectory_id", best->trajectory_id()},
                          {"rejected_trajectory_id", worst->trajectory_id()}};
      RLMESH_RETURN_IF_ERROR(emit(Dump(j)));
    } else {
      const std::string key = g->prompt_id.empty() ? g->group_id : g->prompt_id;
      for (const Trajectory* t : hits) {
        auto it = best_per_prompt.find(key);
        if (it == best_per_prompt.end()) {
          prompt_order.push_back(key);
          best_per_prompt.emplace(key, std::make_pair(t->reward(), *t));
        } else if (t->reward() > it->second.first) {
          it->second = {t->reward(), *t};
        }
      }
    }
  }
  for (const auto& key : prompt_order) {
    const Trajectory& t = best_per_prompt[key].second;
    nlohmann::json j = {{"prompt_id", key},
                        {"prompt_token_ids", ids(t.prompt_token_ids())},
                        {"response_token_ids", ids(t.response_token_ids())},
                        {"reward", t.reward()},
                        {"trajectory_id", t.trajectory_id()}};
    if (!t.response_text().empty()) j["response_text"] = t.response_text();
    RLMESH_RETURN_IF_ERROR(emit(Dump(j)));
  }
  if (chunk.records() > 0 && !sink(chunk)) {
    return absl::CancelledError("export receiver went away");
  }
  return absl::OkStatus();
}

}  // namespace rlmesh
