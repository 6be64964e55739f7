#include "coordinator/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "coordinator/experiment_config.h"

namespace rlmesh {
namespace {

std::string Bar(double frac, int width = 20) {
  const int full = static_cast<int>(std::round(std::max(0.0, std::min(1.0, frac)) * width));
  std::string s;
  for (int i = 0; i < width; ++i) s += i < full ? "\u2588" : "\u2591";
  return s;
}

}  // namespace

std::optional<std::string> ProgressLine(const Stage& stage, int64_t step, int64_t total, const nlohmann::json& j) {
  const int64_t every = std::max<int64_t>(1, total / 20);
  if (step % every != 0 && step != total && !j.contains("accuracy")) return std::nullopt;
  auto get = [&](const char* k) { return j.contains(k) ? j[k].get<double>() : 0.0; };
  std::string line = absl::StrFormat("%-5s [%s] %3.0f%%  step %d/%d", StageName(stage),
                                     Bar(static_cast<double>(step) / total), 100.0 * step / total, step, total);
  if (stage.has_sft()) {
    absl::StrAppendFormat(&line, "  loss %.3f", get("loss"));
  } else if (stage.has_reward_model()) {
    absl::StrAppendFormat(&line, "  loss %.3f  pair acc %.0f%%  margin %.2f", get("loss"), 100 * get("rm_accuracy"),
                          get("margin"));
  } else if (stage.has_dpo()) {
    absl::StrAppendFormat(&line, "  loss %.3f  pair acc %.0f%%  margin %.3f", get("loss"), 100 * get("dpo_accuracy"),
                          get("reward_margin"));
  } else {
    const double gen = get("seconds_generate"), tr = get("seconds_train"), sy = get("seconds_sync");
    const double all = std::max(1e-9, gen + tr + sy);
    absl::StrAppendFormat(&line, "  reward %.2f  kl %.4f  gen %.0f%% train %.0f%% sync %.0f%%",
                          get("rollout_reward_mean"), get("kl"), 100 * gen / all, 100 * tr / all, 100 * sy / all);
  }
  if (j.contains("accuracy")) absl::StrAppendFormat(&line, "  acc %.0f%%", 100 * get("accuracy"));
  return line;
}

std::string SummaryLine(const RunSummary& s, const std::string& run_dir) {
  std::string line = "done: held-out accuracy";
  for (size_t i = 0; i < s.accuracy.size(); ++i) {
    absl::StrAppendFormat(&line, "%s %.1f%% (%s)", i == 0 ? "" : " \u2192", 100 * s.accuracy[i].second,
                          s.accuracy[i].first);
  }
  absl::StrAppendFormat(&line, " in %dm%02ds; metrics in %s/metrics.jsonl", static_cast<int>(s.seconds) / 60,
                        static_cast<int>(s.seconds) % 60, run_dir);
  return line;
}

}  // namespace rlmesh
