#include "coordinator/progress.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
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

std::string EvalSummaryTable(const std::vector<nlohmann::json>& samples, double accuracy,
                             const google::protobuf::Map<std::string, double>& metrics,
                             const google::protobuf::RepeatedField<int32_t>& pass_at) {
  struct Kind {
    int count = 0;
    double tokens = 0;
    std::map<std::string, int> finish;
  };
  std::map<std::string, Kind> kinds;
  int prompts = 0;
  for (const auto& j : samples) {
    Kind& k = kinds[j.value("kind", std::string("?"))];
    ++k.count;
    k.tokens += j.contains("response_token_ids") ? j["response_token_ids"].size() : 0;
    ++k.finish[j.value("finish_reason", std::string("?"))];
    if (j.value("kind", std::string()) == "greedy") ++prompts;
  }
  std::string out = absl::StrFormat("%-22s %s\n", "prompts", std::to_string(prompts));
  absl::StrAppendFormat(&out, "%-22s %.1f%%\n", "greedy accuracy", 100 * accuracy);
  for (int k : pass_at) {
    auto it = metrics.find(absl::StrCat("pass@", k));
    if (it != metrics.end()) absl::StrAppendFormat(&out, "%-22s %.1f%%\n", absl::StrCat("pass@", k), 100 * it->second);
  }
  for (const auto& [name, k] : kinds) {
    std::string ends;
    for (const auto& [reason, n] : k.finish) {
      absl::StrAppendFormat(&ends, "%s%s %.0f%%", ends.empty() ? "" : ", ", reason, 100.0 * n / k.count);
    }
    absl::StrAppendFormat(&out, "%-22s %d samples, %.1f tokens on average; ended by %s\n", name, k.count,
                          k.tokens / k.count, ends);
  }
  return out;
}

}  // namespace rlmesh
