// ReplayStore: options, validation, open, PutGroups and SampleGroups. The
// rest of the class is in catalog.cc, cursors.cc, query.cc, trim.cc and
// export.cc; the pure pieces in format.h, tokens.h, filter.h and sampler.h.

#include "replay_buffer/store.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "replay_buffer/codec.h"
#include "replay_buffer/filter.h"
#include "replay_buffer/format.h"
#include "replay_buffer/sampler.h"
#include "replay_buffer/tokens.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

namespace rlmesh {

using replay::Be64;
using replay::CheckId;
using replay::DataGroupPrefix;
using replay::DataKey;
using replay::EncodeAckToken;
using replay::EncodeSummary;
using replay::FromRocks;
using replay::GroupKey;
using replay::kExpTag;
using replay::kGroupTag;
using replay::kTrajTag;
using replay::MetaKey;
using replay::PromptKey;

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
    // Flush the memtables so that the next Open has no WAL to replay. With
    // the WAL on, RocksDB's own close does not flush. A failure (a full
    // disk) loses nothing: the WAL still holds every acknowledged write.
    rocksdb::FlushOptions flush;
    flush.allow_write_stall = true;
    rocksdb::Status s = db_->Flush(flush, handles_);
    if (!s.ok()) RLMESH_LOG(WARNING) << "flush at close: " << s.ToString();
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

void ReplayStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

// ---------------------------------------------------------------- put

namespace {

// The stored record of sample `t`: the sample with its group's experiment_id,
// group_id, prompt_id and step (ValidateGroup has checked that each is unset
// in the sample or equal to the group's).
void SerializeWithGroupFields(const Trajectory& t, const TrajectoryGroup& group, std::string* out) {
  Trajectory record = t;
  record.set_experiment_id(group.experiment_id());
  record.set_group_id(group.group_id());
  record.set_prompt_id(group.prompt_id());
  record.set_step(group.step());
  record.SerializeToString(out);
}

}  // namespace

absl::StatusOr<PutGroupsResponse> ReplayStore::PutGroups(const PutGroupsRequest& request) {
  if (request.groups().empty()) return absl::InvalidArgumentError("groups is empty");
  for (int i = 0; i < request.groups_size(); ++i) {
    RLMESH_RETURN_IF_ERROR(ValidateGroup(request.groups(i), i, options_));
  }
  // An id twice in one request would wait for its own reservation below,
  // and the idempotency lookup cannot see a twin that is not written yet.
  absl::flat_hash_map<std::string, std::string> first;  // exp \0 tag id -> where
  for (int i = 0; i < request.groups_size(); ++i) {
    const TrajectoryGroup& g = request.groups(i);
    const std::string exp = absl::StrCat(g.experiment_id(), absl::string_view("\0", 1));
    const std::string where = absl::StrCat("groups[", i, "]");
    auto [at, fresh] = first.emplace(absl::StrCat(exp, "g", g.group_id()), where);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".group_id '", g.group_id(), "' repeats ",
                                                     at->second, " of the same request"));
    }
    for (int j = 0; j < g.samples_size(); ++j) {
      const std::string& id = g.samples(j).trajectory_id();
      auto [tat, tfresh] = first.emplace(absl::StrCat(exp, "t", id), absl::StrCat(where, ".samples[", j, "]"));
      if (!tfresh) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".samples[", j, "].trajectory_id '", id,
                                                       "' repeats ", tat->second, " of the same request"));
      }
    }
  }
  return WriteGroups(request);
}

// Long because: reservation of the ids, the idempotency lookup and the one synced batch write
// happen in that order under the same reservation.
absl::StatusOr<PutGroupsResponse> ReplayStore::WriteGroups(const PutGroupsRequest& request) {
  const int n = request.groups_size();
  // Reserve every group id and trajectory id of the request at once, so that
  // two concurrent writers of the same group (a retried call) cannot both
  // write it, and take a seq per group.
  std::vector<Experiment*> exps(n);
  std::vector<int64_t> seqs(n);
  std::vector<std::pair<Experiment*, std::string>> reserved;
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < n; ++i) {
      const TrajectoryGroup& g = request.groups(i);
      exps[i] = &experiments_[g.experiment_id()];
      reserved.emplace_back(exps[i], absl::StrCat("g", g.group_id()));
      for (const auto& t : g.samples()) reserved.emplace_back(exps[i], absl::StrCat("t", t.trajectory_id()));
    }
    auto free = [&]() {
      for (const auto& [e, id] : reserved) {
        if (e->inflight_ids.contains(id)) return false;
      }
      return true;
    };
    mu_.Await(absl::Condition(&free));
    for (const auto& [e, id] : reserved) e->inflight_ids.insert(id);
    for (int i = 0; i < n; ++i) {
      seqs[i] = exps[i]->next_seq++;
      exps[i]->inflight_seqs.insert(seqs[i]);
    }
  }
  std::vector<std::shared_ptr<GroupSummary>> committed(n);
  auto release = [&](bool written) {
    absl::MutexLock lock(&mu_);
    for (const auto& [e, id] : reserved) e->inflight_ids.erase(id);
    for (int i = 0; i < n; ++i) {
      Experiment& e = *exps[i];
      e.inflight_seqs.erase(seqs[i]);
      if (!written || committed[i] == nullptr) continue;
      e.trajectories += committed[i]->samples.size();
      e.CountVersions(*committed[i], +1);
      e.bytes += committed[i]->bytes;
      e.by_step[{committed[i]->step, seqs[i]}] = committed[i];
      e.by_seq[seqs[i]] = committed[i];
      e.random_index.Add(committed[i]);
    }
    ++commits_;  // a visible_limit may have moved even without a commit
  };

  // Idempotency: a stored group id or trajectory id decides. One lookup for
  // the whole request: per group, its group key and then its trajectories'.
  std::vector<std::string> meta_keys;
  for (const auto& g : request.groups()) {
    meta_keys.push_back(MetaKey(kGroupTag, g.experiment_id(), g.group_id()));
    for (const auto& t : g.samples()) meta_keys.push_back(MetaKey(kTrajTag, g.experiment_id(), t.trajectory_id()));
  }
  std::vector<rocksdb::Slice> key_slices(meta_keys.begin(), meta_keys.end());
  std::vector<rocksdb::ColumnFamilyHandle*> cfs(meta_keys.size(), meta_cf_);
  std::vector<std::string> values;
  std::vector<rocksdb::Status> found = db_->MultiGet(rocksdb::ReadOptions(), cfs, key_slices, &values);
  PutGroupsResponse response;
  rocksdb::WriteBatch batch;
  std::map<Experiment*, std::pair<std::string, int64_t>> high;  // exp -> (name, next seq)
  size_t k0 = 0;
  for (int i = 0; i < n; ++i) {
    const TrajectoryGroup& group = request.groups(i);
    const size_t keys = 1 + group.samples_size();
    int present = 0;
    for (size_t k = k0; k < k0 + keys; ++k) {
      if (found[k].ok()) {
        ++present;
      } else if (!found[k].IsNotFound()) {
        release(false);
        return FromRocks(found[k], absl::StrCat("groups[", i, "]: idempotency lookup"));
      }
    }
    if (present > 0) {
      const bool same = present == static_cast<int>(keys) &&
                        std::all_of(values.begin() + k0, values.begin() + k0 + keys,
                                    [&](const std::string& v) { return v == values[k0]; });
      if (!same) {
        release(false);
        if (found[k0].ok()) {
          return absl::InvalidArgumentError(absl::StrCat("groups[", i, "]: group_id '", group.group_id(),
                                                         "' is already stored with other trajectory ids"));
        }
        for (size_t k = 1; k < keys; ++k) {
          if (found[k0 + k].ok()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "groups[", i, "]: samples[", k - 1, "].trajectory_id '", group.samples(k - 1).trajectory_id(),
                "' is already stored in another group"));
          }
        }
      }
      response.set_duplicates(response.duplicates() + 1);
      k0 += keys;
      continue;
    }
    k0 += keys;
    const std::string& exp = group.experiment_id();
    const int64_t seq = seqs[i];
    auto summary = std::make_shared<GroupSummary>();
    summary->seq = seq;
    summary->step = group.step();
    summary->group_id = group.group_id();
    summary->prompt_id = group.prompt_id();
    std::string value;
    for (int j = 0; j < group.samples_size(); ++j) {
      const Trajectory& t = group.samples(j);
      SerializeWithGroupFields(t, group, &value);
      summary->bytes += value.size();
      summary->samples.push_back({t.reward(), t.policy_version(), t.response_token_ids_size(),
                                  static_cast<int32_t>(t.finish_reason())});
      batch.Put(data_cf_, DataKey(exp, group.step(), seq, j), value);
      batch.Put(meta_cf_, MetaKey(kTrajTag, exp, t.trajectory_id()), Be64(seq));
    }
    batch.Put(groups_cf_, GroupKey(exp, seq), EncodeSummary(*summary, group));
    batch.Put(prompt_cf_, PromptKey(exp, group.prompt_id(), group.step(), seq), "");
    batch.Put(meta_cf_, MetaKey(kGroupTag, exp, group.group_id()), Be64(seq));
    auto& h = high[exps[i]];
    h.first = exp;
    h.second = std::max(h.second, seq + 1);
    committed[i] = std::move(summary);
    response.set_written(response.written() + 1);
  }
  if (response.written() == 0) {
    release(false);
    return response;
  }
  for (const auto& [e, h] : high) batch.Put(meta_cf_, MetaKey(kExpTag, h.first), Be64(h.second));
  // One synced write for the request: each group lands whole, and so does
  // the request.
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  rocksdb::Status s = db_->Write(wo, &batch);
  if (!s.ok()) {
    release(false);
    return WriteError(s, "writing groups");
  }
  release(true);
  return response;
}

absl::Status ReplayStore::WriteError(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  if (!s.IsNoSpace()) return FromRocks(s, what);
  return absl::ResourceExhaustedError(absl::StrCat(what, ": disk full at db_path ", options_.db_path, " (",
                                                   s.ToString(), "); what was acknowledged is kept, and writes "
                                                   "resume once space is freed"));
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
  const replay::SampleFilter filter{request.min_policy_version(), request.skip_zero_variance()};

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
      replay::Selection selection;
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
        selection = replay::SelectFifo(e->by_seq, consumer->lease_next, e->visible_limit(),
                                       consumer->acked, want, filter);
      } else if (e != nullptr) {
        selection = e->random_index.Select(request.mode(), request.seed(), want, filter);
      }
      picked = std::move(selection.picked);
      skipped = selection.skipped;
      end_seq = selection.end_seq;
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

}  // namespace rlmesh
