#include "coordinator/step_metrics.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "absl/strings/match.h"

namespace rlmesh {
namespace {

enum class Merge { kMean, kSum, kMax, kMin, kFirst };

Merge MergeOf(const std::string& key) {
  static const std::set<std::string> kSum = {"tokens", "groups", "pairs", "rows", "loss_tokens",
                                             "tokens_per_second", "mean_weight"};
  static const std::set<std::string> kFirst = {"grad_norm", "value_grad_norm", "lr", "skipped",
                                               "optimizer_steps", "old_logprobs_recomputed"};
  if (kSum.count(key)) return Merge::kSum;
  if (kFirst.count(key)) return Merge::kFirst;
  if (absl::EndsWith(key, "_max") || absl::StartsWith(key, "seconds_")) return Merge::kMax;
  if (absl::EndsWith(key, "_min")) return Merge::kMin;
  return Merge::kMean;
}

}  // namespace

StepMetrics MergeStepMetrics(const std::vector<StepMetrics>& ranks, int tp) {
  if (ranks.size() <= 1) return ranks.empty() ? StepMetrics() : ranks[0];
  const size_t stride = static_cast<size_t>(std::max(1, tp));
  // Means are weighted by each replica's mean_weight when every replica
  // reports one and they do not all weigh 0.
  bool weighted = true;
  double total_weight = 0;
  for (size_t r = 0; r < ranks.size(); r += stride) {
    auto it = ranks[r].values().find("mean_weight");
    weighted = weighted && it != ranks[r].values().end() && it->second >= 0;
    if (it != ranks[r].values().end()) total_weight += it->second;
  }
  weighted = weighted && total_weight > 0;
  struct Acc {
    double sum = 0, max = 0, min = 0, first = 0;
    double weighted_sum = 0, weight = 0;
    int n = 0;
  };
  std::map<std::string, Acc> acc;
  for (size_t r = 0; r < ranks.size(); r += stride) {
    const double w = weighted ? ranks[r].values().at("mean_weight") : 1.0;
    for (const auto& [key, v] : ranks[r].values()) {
      Acc& a = acc[key];
      if (a.n == 0) {
        a.max = a.min = a.first = v;
      } else {
        a.max = std::max(a.max, v);
        a.min = std::min(a.min, v);
      }
      a.sum += v;
      a.weighted_sum += w * v;
      a.weight += w;
      ++a.n;
    }
  }
  StepMetrics out;
  auto& values = *out.mutable_values();
  for (const auto& [key, a] : acc) {
    switch (MergeOf(key)) {
      case Merge::kMean:
        // A key only replicas of weight 0 report: their plain mean.
        values[key] = a.weight > 0 ? a.weighted_sum / a.weight : a.sum / a.n;
        break;
      case Merge::kSum:
        values[key] = a.sum;
        break;
      case Merge::kMax:
        values[key] = a.max;
        break;
      case Merge::kMin:
        values[key] = a.min;
        break;
      case Merge::kFirst:
        values[key] = a.first;
        break;
    }
  }
  return out;
}

}  // namespace rlmesh
