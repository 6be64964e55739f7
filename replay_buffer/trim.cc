// ReplayStore::Trim: drops the oldest steps of an experiment (keep_steps,
// max_bytes) from disk and from the catalog.

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

using replay::Be64;
using replay::CheckId;
using replay::DataGroupPrefix;
using replay::DecodeSummary;
using replay::FromRocks;
using replay::GroupKey;
using replay::kExpTag;
using replay::kGroupTag;
using replay::kTrajTag;
using replay::MetaKey;
using replay::PromptKey;

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
  RLMESH_RETURN_IF_ERROR(WriteError(db_->Write(wo, &batch), "trimming"));
  absl::MutexLock lock(&mu_);
  Experiment& e = experiments_[exp];
  for (const auto& g : drop) {
    if (e.by_seq.erase(g->seq) == 0) continue;
    e.by_step.erase({g->step, g->seq});
    e.random_index.Remove(*g);
    e.trajectories -= g->samples.size();
    e.CountVersions(*g, -1);
    e.bytes -= g->bytes;
  }
  RLMESH_LOG(INFO) << "trim experiment=" << exp << " groups_removed=" << response.groups_removed();
  return response;
}

}  // namespace rlmesh
