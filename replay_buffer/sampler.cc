#include "replay_buffer/sampler.h"

#include <random>

namespace rlmesh::replay {

Selection SelectFifo(const std::map<int64_t, GroupPtr>& by_seq, int64_t next_seq, int64_t visible_limit,
                     const std::map<int64_t, Lease>& acked, size_t want, const Accept& accept) {
  Selection out;
  out.end_seq = next_seq;
  auto done = acked.begin();
  for (auto it = by_seq.lower_bound(next_seq);
       it != by_seq.end() && it->first < visible_limit && out.picked.size() < want; ++it) {
    while (done != acked.end() && done->second.to <= it->first) ++done;
    out.end_seq = it->first + 1;
    if (done != acked.end() && done->first <= it->first) continue;
    if (accept(*it->second)) {
      out.picked.push_back(it->second);
    } else {
      ++out.skipped;
    }
  }
  return out;
}

Selection SelectRandom(const std::map<int64_t, GroupPtr>& by_seq, SampleMode mode, uint64_t seed, size_t want,
                       const Accept& accept) {
  Selection out;
  std::vector<GroupPtr> candidates;
  for (const auto& [seq, g] : by_seq) {
    if (accept(*g)) candidates.push_back(g);
  }
  out.skipped = static_cast<int>(by_seq.size() - candidates.size());
  if (candidates.size() < want) return out;
  std::mt19937_64 rng(seed);
  if (mode == SAMPLE_UNIFORM) {
    std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
    for (size_t i = 0; i < want; ++i) out.picked.push_back(candidates[pick(rng)]);
  } else {
    // Priority = reward variance; a small floor keeps zero-variance groups
    // reachable unless skip_zero_variance drops them.
    std::vector<double> weights;
    weights.reserve(candidates.size());
    for (const auto& g : candidates) weights.push_back(g->reward_variance() + 1e-6);
    std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
    for (size_t i = 0; i < want; ++i) out.picked.push_back(candidates[pick(rng)]);
  }
  return out;
}

}  // namespace rlmesh::replay
