#include "replay_buffer/sampler.h"

#include <algorithm>
#include <random>
#include <utility>

namespace rlmesh::replay {

Selection SelectFifo(const std::map<int64_t, GroupPtr>& by_seq, int64_t next_seq, int64_t visible_limit,
                     const std::map<int64_t, Lease>& acked, size_t want, const SampleFilter& filter) {
  Selection out;
  out.end_seq = next_seq;
  auto done = acked.begin();
  for (auto it = by_seq.lower_bound(next_seq);
       it != by_seq.end() && it->first < visible_limit && out.picked.size() < want; ++it) {
    while (done != acked.end() && done->second.to <= it->first) ++done;
    out.end_seq = it->first + 1;
    if (done != acked.end() && done->first <= it->first) continue;
    if (filter.Admits(*it->second)) {
      out.picked.push_back(it->second);
    } else {
      ++out.skipped;
    }
  }
  return out;
}

void SampleIndex::Add(const GroupPtr& group) {
  const int64_t version = group->min_policy_version();
  size_t b = std::lower_bound(versions_.begin(), versions_.end(), version) - versions_.begin();
  if (b == versions_.size() || versions_[b] != version) {
    versions_.insert(versions_.begin() + static_cast<std::ptrdiff_t>(b), version);
    buckets_.insert(buckets_.begin() + static_cast<std::ptrdiff_t>(b), std::make_unique<Bucket>());
    spread_count_.Insert(b, 0);
    all_count_.Insert(b, 0);
    spread_priority_.Insert(b, 0);
    all_priority_.Insert(b, 0);
    ++empty_buckets_;
  }
  Bucket& bucket = *buckets_[b];
  Part* part = group->zero_variance() ? &bucket.flat : &bucket.spread;
  const auto at = std::lower_bound(part->seqs.begin(), part->seqs.end(), group->seq);
  if (at != part->seqs.end() && *at == group->seq) return;
  if (bucket.spread.live + bucket.flat.live == 0) --empty_buckets_;
  Insert(part, group);
  ++size_;
  Refresh(b);
}

void SampleIndex::Insert(Part* part, const GroupPtr& group) {
  const size_t i = std::lower_bound(part->seqs.begin(), part->seqs.end(), group->seq) - part->seqs.begin();
  part->seqs.insert(part->seqs.begin() + static_cast<std::ptrdiff_t>(i), group->seq);
  part->slots.insert(part->slots.begin() + static_cast<std::ptrdiff_t>(i), group);
  part->count.Insert(i, 1);
  part->priority.Insert(i, group->reward_variance() + 1e-6);
  ++part->live;
}

void SampleIndex::Remove(const GroupSummary& group) {
  const int64_t version = group.min_policy_version();
  const size_t b = std::lower_bound(versions_.begin(), versions_.end(), version) - versions_.begin();
  if (b == versions_.size() || versions_[b] != version) return;
  Bucket& bucket = *buckets_[b];
  if (!Erase(group.zero_variance() ? &bucket.flat : &bucket.spread, group.seq)) return;
  --size_;
  Refresh(b);
  if (bucket.spread.live + bucket.flat.live == 0) {
    ++empty_buckets_;
    CompactBuckets();
  }
}

bool SampleIndex::Erase(Part* part, int64_t seq) {
  const auto at = std::lower_bound(part->seqs.begin(), part->seqs.end(), seq);
  if (at == part->seqs.end() || *at != seq) return false;
  const size_t i = at - part->seqs.begin();
  if (part->slots[i] == nullptr) return false;
  part->slots[i] = nullptr;
  part->count.Set(i, 0);
  part->priority.Set(i, 0);
  --part->live;
  // Trim removes the oldest groups first: drop dead slots once they are
  // half of the part, so memory follows the live groups (amortised O(1)).
  if (part->seqs.size() >= 64 && part->live * 2 < static_cast<int64_t>(part->seqs.size())) Compact(part);
  return true;
}

void SampleIndex::Compact(Part* part) {
  Part fresh;
  for (const GroupPtr& g : part->slots) {
    if (g != nullptr) Insert(&fresh, g);
  }
  *part = std::move(fresh);
}

void SampleIndex::Refresh(size_t b) {
  const Bucket& bucket = *buckets_[b];
  spread_count_.Set(b, bucket.spread.live);
  all_count_.Set(b, bucket.spread.live + bucket.flat.live);
  const double spread = bucket.spread.priority.Total();
  spread_priority_.Set(b, spread);
  all_priority_.Set(b, spread + bucket.flat.priority.Total());
}

void SampleIndex::CompactBuckets() {
  if (empty_buckets_ < 64 || empty_buckets_ * 2 < buckets_.size()) return;
  std::vector<int64_t> versions;
  std::vector<std::unique_ptr<Bucket>> buckets;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b]->spread.live + buckets_[b]->flat.live == 0) continue;
    versions.push_back(versions_[b]);
    buckets.push_back(std::move(buckets_[b]));
  }
  versions_ = std::move(versions);
  buckets_ = std::move(buckets);
  spread_count_ = {};
  all_count_ = {};
  spread_priority_ = {};
  all_priority_ = {};
  for (size_t b = 0; b < buckets_.size(); ++b) {
    spread_count_.Insert(b, 0);
    all_count_.Insert(b, 0);
    spread_priority_.Insert(b, 0);
    all_priority_.Insert(b, 0);
    Refresh(b);
  }
  empty_buckets_ = 0;
}

namespace {

// The live group of `part` holding unit `r` of its weights `tree`
// (0 <= r < tree.Total()). With floating-point weights, rounding can land
// just past the last live group or on a removed one; the nearest live group
// below (else above) is taken then.
template <typename T>
const GroupPtr& FindIn(const std::vector<GroupPtr>& slots, const Fenwick<T>& tree, T r) {
  size_t i = std::min(tree.Find(std::max<T>(0, r)), slots.size() - 1);
  size_t j = i;
  while (slots[j] == nullptr && j > 0) --j;
  if (slots[j] != nullptr) return slots[j];
  while (slots[i] == nullptr) ++i;
  return slots[i];
}

}  // namespace

Selection SampleIndex::Select(SampleMode mode, uint64_t seed, size_t want, const SampleFilter& filter) const {
  const int64_t min_policy_version = filter.min_policy_version;
  const bool skip_zero_variance = filter.skip_zero_variance;
  Selection out;
  const size_t b0 = std::lower_bound(versions_.begin(), versions_.end(), min_policy_version) - versions_.begin();
  const Fenwick<int64_t>& counts = skip_zero_variance ? spread_count_ : all_count_;
  const int64_t before = counts.Prefix(b0);
  const int64_t qualifying = counts.Total() - before;
  out.skipped = static_cast<int>(static_cast<int64_t>(size_) - qualifying);
  if (qualifying < static_cast<int64_t>(want) || want == 0) return out;
  std::mt19937_64 rng(seed);
  if (mode == SAMPLE_UNIFORM) {
    // Draw r among the admitted groups, find its bucket, then its part and
    // the group within the part.
    std::uniform_int_distribution<int64_t> draw(0, qualifying - 1);
    for (size_t n = 0; n < want; ++n) {
      const int64_t r = before + draw(rng);
      const size_t b = counts.Find(r);
      const Bucket& bucket = *buckets_[b];
      const int64_t local = r - counts.Prefix(b);
      if (local < bucket.spread.live) {
        out.picked.push_back(bucket.spread.slots[bucket.spread.count.Find(local)]);
      } else {
        out.picked.push_back(bucket.flat.slots[bucket.flat.count.Find(local - bucket.spread.live)]);
      }
    }
    return out;
  }
  // Prioritized: the same walk over priority weights. Rounding can put a
  // draw on a bucket or part with no live group; the draw then moves to the
  // nearest one that has some.
  const Fenwick<double>& weights = skip_zero_variance ? spread_priority_ : all_priority_;
  const double wbefore = weights.Prefix(b0);
  const double total = weights.Total() - wbefore;
  std::uniform_real_distribution<double> draw(0, total);
  for (size_t n = 0; n < want; ++n) {
    const double r = wbefore + draw(rng);
    size_t b = std::clamp(weights.Find(r), b0, buckets_.size() - 1);
    auto admitted = [&](size_t k) {
      return (skip_zero_variance ? spread_count_ : all_count_).weight(k) > 0;
    };
    size_t down = b;
    while (!admitted(down) && down > b0) --down;
    if (admitted(down)) {
      b = down;
    } else {
      while (!admitted(b)) ++b;
    }
    const Bucket& bucket = *buckets_[b];
    const double local = r - weights.Prefix(b);
    const double spread = bucket.spread.priority.Total();
    const bool in_spread =
        bucket.flat.live == 0 || skip_zero_variance || (bucket.spread.live > 0 && local < spread);
    if (in_spread) {
      out.picked.push_back(FindIn(bucket.spread.slots, bucket.spread.priority, local));
    } else {
      out.picked.push_back(FindIn(bucket.flat.slots, bucket.flat.priority, local - spread));
    }
  }
  return out;
}

}  // namespace rlmesh::replay
