#pragma once

// The lines a run prints for a person at a terminal: a progress bar per
// step (about 20 per stage, plus any step with an eval) and the final
// summary. Pure functions: the runner decides where they go.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/runner_options.h"
#include "nlohmann/json.hpp"
#include "proto/config.pb.h"

namespace rlmesh {

// The progress line after stage step `step` of `total` with that step's
// metrics record, or nullopt when this step prints none.
std::optional<std::string> ProgressLine(const Stage& stage, int64_t step, int64_t total, const nlohmann::json& record);

// "done: held-out accuracy 0.0% (init) → 45.0% (sft) in 1m05s; metrics in ..."
std::string SummaryLine(const RunSummary& summary, const std::string& run_dir);

// `coordinator eval`'s table: prompts, greedy accuracy, each pass@k of
// `pass_at` (from `metrics`, "pass@K"), and per kind of sample (greedy,
// sampled) the mean completion length and how completions ended. `samples`
// are the per-sample records (kind, response_token_ids, finish_reason).
std::string EvalSummaryTable(const std::vector<nlohmann::json>& samples, double accuracy,
                             const google::protobuf::Map<std::string, double>& metrics,
                             const google::protobuf::RepeatedField<int32_t>& pass_at);

}  // namespace rlmesh
