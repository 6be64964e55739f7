// ReplayStore's read side for people and tools: Query (filtered pages of
// trajectories, per-step aggregates) and Stats.

#include "replay_buffer/store.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
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

using replay::Be64;
using replay::CheckId;
using replay::DataKey;
using replay::DecodePageToken;
using replay::EncodePageToken;
using replay::ExpPrefix;
using replay::FromRocks;
using replay::PagePos;
using replay::PutBe64;
using replay::Reader;
using replay::SampleMatches;
using replay::Sv;
using replay::ValidateFilter;

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

// Long because: candidate selection (prompt index or step order), the catalog filters and the
// paging share one cursor, then the page's bodies are read.
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
  {
    absl::MutexLock cursor_lock(&cursor_mu_);
    absl::MutexLock lock(&mu_);
    if (!request.experiment_id().empty() && FindExperiment(request.experiment_id()) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("experiment_id '", request.experiment_id(), "' is unknown"));
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
        if (!e.versions.empty()) {
          s->set_min_policy_version(e.versions.begin()->first);
          s->set_max_policy_version(e.versions.rbegin()->first);
        }
      }
      for (const auto& [name, c] : e.consumers) (*s->mutable_consumed())[name] = c.consumed;
    }
  }
  // RocksDB's properties are thread-safe: read outside the catalog's locks.
  StoreMemory* memory = response.mutable_memory();
  uint64_t v = 0;
  // One cache serves every column family: any handle reports it.
  if (db_->GetIntProperty(data_cf_, rocksdb::DB::Properties::kBlockCacheUsage, &v)) {
    memory->set_block_cache_usage(static_cast<int64_t>(v));
  }
  if (db_->GetIntProperty(data_cf_, rocksdb::DB::Properties::kBlockCacheCapacity, &v)) {
    memory->set_block_cache_capacity(static_cast<int64_t>(v));
  }
  if (db_->GetAggregatedIntProperty(rocksdb::DB::Properties::kCurSizeAllMemTables, &v)) {
    memory->set_memtables(static_cast<int64_t>(v));
  }
  if (db_->GetAggregatedIntProperty(rocksdb::DB::Properties::kEstimateTableReadersMem, &v)) {
    memory->set_table_readers(static_cast<int64_t>(v));
  }
  return response;
}

}  // namespace rlmesh
