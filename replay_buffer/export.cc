// ReplayStore::Export: the trajectories matching a filter as JSONL chunks.

#include "replay_buffer/store.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "replay_buffer/codec.h"
#include "replay_buffer/filter.h"
#include "replay_buffer/format.h"
#include "replay_buffer/tokens.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

namespace rlmesh {

using replay::SampleMatches;
using replay::ValidateFilter;

namespace {

std::string Dump(const nlohmann::json& j) {
  // Invalid UTF-8 in a decoded text must not abort an export.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

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
