// Held-out evaluation: greedy accuracy (one sample per prompt, scored by the
// first verifier) and, with eval.pass_at, the sampled pass@k.

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "coordinator/pass_at_k.h"
#include "coordinator/run_loop.h"

namespace rlmesh {

absl::StatusOr<double> RunLoop::Evaluate(const std::string& label, int64_t step, bool final, bool pass_at) {
  SetPhase("eval");
  const absl::Time start = absl::Now();
  const auto& eval = task_->eval();
  const int count = cfg().eval().prompts() > 0 ? std::min<int>(cfg().eval().prompts(), eval.size()) : eval.size();
  std::vector<Prompt> prompts;
  for (int i = 0; i < count; ++i) prompts.push_back(MakePrompt(eval[i]));
  const std::string& first = cfg().reward().verifiers(0).label().empty() ? cfg().reward().verifiers(0).name()
                                                                          : cfg().reward().verifiers(0).label();
  // Whether each scored item is right by the first verifier, in order.
  auto right = [&](const ScoreResponse& scores) {
    std::vector<bool> out;
    for (const auto& r : scores.results()) {
      auto it = r.components().find(first);
      out.push_back(it != r.components().end() && it->second >= 1.0 - 1e-9);
    }
    return out;
  };
  // A corpus (task kind text) has no held-out prompts: nothing to generate
  // or score; accuracy 0 over 0 prompts.
  std::vector<TrajectoryGroup> groups;
  ScoreResponse scores;
  if (!prompts.empty()) {
    RLMESH_ASSIGN_OR_RETURN(groups, Generate(prompts, 1, Sampling(true, cfg().seed()), false, step, versions_.rollout()));
    RLMESH_ASSIGN_OR_RETURN(scores, Score(groups));
  }
  double correct = 0;
  for (bool r : right(scores)) correct += r ? 1 : 0;
  const double acc = groups.empty() ? 0 : correct / groups.size();
  nlohmann::json j = {{"event", "eval"},      {"stage", label},    {"step", step},
                      {"policy_version", versions_.learner()}, {"accuracy", acc}, {"prompts", groups.size()},
                      {"time", absl::ToUnixMicros(absl::Now()) / 1e6}};
  // pass@k: n = the largest k samples per prompt at the rollout temperature.
  int n = 0;
  for (int k : cfg().eval().pass_at()) n = std::max(n, k);
  std::string pass_line;
  if (pass_at && n > 0 && !prompts.empty()) {
    RLMESH_ASSIGN_OR_RETURN(auto sampled, Generate(prompts, n, Sampling(false, cfg().seed() * 7919ULL + step), false,
                                                   step, versions_.rollout()));
    RLMESH_ASSIGN_OR_RETURN(auto sampled_scores, Score(sampled));
    const std::vector<bool> ok = right(sampled_scores);
    // Right samples per prompt (scores come back in request order).
    std::vector<int> right_per_prompt;
    size_t at = 0;
    for (const auto& g : sampled) {
      int c = 0;
      for (int s = 0; s < g.samples_size() && at < ok.size(); ++s) c += ok[at++] ? 1 : 0;
      right_per_prompt.push_back(c);
    }
    for (int k : cfg().eval().pass_at()) {
      const double pk = MeanPassAtK(right_per_prompt, n, k);
      j[absl::StrCat("pass@", k)] = pk;
      absl::StrAppendFormat(&pass_line, ", pass@%d %.1f%%", k, 100 * pk);
      SetMetric(absl::StrCat("pass@", k), pk);
    }
  }
  j["seconds_eval"] = Seconds(start);
  metrics_.Record(j);
  SetMetric("accuracy", acc);
  if (final) {
    Print(absl::StrFormat("eval  %-6s held-out greedy accuracy %.1f%% (%d prompts)%s", label, 100 * acc,
                          static_cast<int>(groups.size()), pass_line));
  }
  return acc;
}

}  // namespace rlmesh
