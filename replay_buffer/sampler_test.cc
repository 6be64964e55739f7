// The replay store's selection logic on hand-made catalogs: no RocksDB.

#include "replay_buffer/sampler.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace rlmesh::replay {
namespace {

// A catalog entry with the given rewards (one sample per reward).
GroupPtr Group(int64_t seq, std::vector<double> rewards, int64_t policy_version = 1) {
  auto g = std::make_shared<GroupSummary>();
  g->seq = seq;
  g->group_id = "g" + std::to_string(seq);
  for (double r : rewards) {
    SampleInfo s;
    s.reward = r;
    s.policy_version = policy_version;
    g->samples.push_back(s);
  }
  return g;
}

std::vector<int64_t> Seqs(const Selection& s) {
  std::vector<int64_t> out;
  for (const auto& g : s.picked) out.push_back(g->seq);
  return out;
}

const SampleFilter kAll;

}  // namespace

TEST_CASE("FIFO takes the oldest visible groups from the cursor, in seq order") {
  std::map<int64_t, GroupPtr> by_seq;
  for (int64_t seq : {1, 2, 3, 5, 6, 7}) by_seq[seq] = Group(seq, {0, 1});
  Selection s = SelectFifo(by_seq, /*next_seq=*/2, /*visible_limit=*/100, {}, /*want=*/3, kAll);
  CHECK(Seqs(s) == std::vector<int64_t>{2, 3, 5});
  CHECK(s.skipped == 0);
  CHECK(s.end_seq == 6);  // the next lease starts after seq 5
}

TEST_CASE("FIFO stops at the visible limit and counts filtered groups as skipped") {
  std::map<int64_t, GroupPtr> by_seq;
  // Seq 5's rewards are flat; the versions are the seqs.
  for (int64_t seq = 1; seq <= 7; ++seq) {
    by_seq[seq] = Group(seq, seq == 5 ? std::vector<double>{0, 0} : std::vector<double>{0, 1}, /*policy_version=*/seq);
  }
  // Versions from 3, rewards that vary; seq 7 and above may still be being
  // written.
  Selection s = SelectFifo(by_seq, 1, /*visible_limit=*/7, {}, 10, SampleFilter{3, true});
  CHECK(Seqs(s) == std::vector<int64_t>{3, 4, 6});
  CHECK(s.skipped == 3);
  CHECK(s.end_seq == 7);
  // Without skip_zero_variance the flat group is taken.
  CHECK(Seqs(SelectFifo(by_seq, 1, 7, {}, 10, SampleFilter{3, false})) == std::vector<int64_t>{3, 4, 5, 6});
}

TEST_CASE("FIFO never redelivers groups inside acknowledged ranges") {
  std::map<int64_t, GroupPtr> by_seq;
  for (int64_t seq = 1; seq <= 8; ++seq) by_seq[seq] = Group(seq, {1});
  std::map<int64_t, Lease> acked;
  acked[3] = Lease{3, 5, 2, absl::InfiniteFuture()};  // seqs 3 and 4
  acked[6] = Lease{6, 7, 1, absl::InfiniteFuture()};  // seq 6
  Selection s = SelectFifo(by_seq, 1, 100, acked, 4, kAll);
  CHECK(Seqs(s) == std::vector<int64_t>{1, 2, 5, 7});
  CHECK(s.end_seq == 8);
}

TEST_CASE("FIFO with nothing past the cursor picks nothing and keeps the cursor") {
  std::map<int64_t, GroupPtr> by_seq;
  by_seq[1] = Group(1, {1});
  Selection s = SelectFifo(by_seq, 2, 100, {}, 1, kAll);
  CHECK(s.picked.empty());
  CHECK(s.end_seq == 2);
}

// An index holding `groups`, added in the given order.
SampleIndex Index(const std::vector<GroupPtr>& groups) {
  SampleIndex index;
  for (const auto& g : groups) index.Add(g);
  return index;
}

// The groups picked by `calls` Select calls of `want` draws, seeds 1, 2, ...
// (a call cannot draw more groups than qualify).
std::vector<int64_t> Draws(const SampleIndex& index, SampleMode mode, int calls, size_t want,
                           int64_t min_policy_version, bool skip_zero_variance) {
  std::vector<int64_t> out;
  for (int c = 1; c <= calls; ++c) {
    for (int64_t seq : Seqs(index.Select(mode, c, want, {min_policy_version, skip_zero_variance}))) {
      out.push_back(seq);
    }
  }
  return out;
}

TEST_CASE("Fenwick prefix sums and Find follow inserts in the middle and zeroed weights") {
  Fenwick<int64_t> f;
  std::vector<int64_t> plain;
  std::mt19937_64 rng(3);
  for (int n = 0; n < 200; ++n) {
    const size_t at = rng() % (plain.size() + 1);
    const int64_t w = static_cast<int64_t>(rng() % 4);
    f.Insert(at, w);
    plain.insert(plain.begin() + static_cast<std::ptrdiff_t>(at), w);
    if (n % 3 == 0) {
      const size_t z = rng() % plain.size();
      f.Set(z, 0);
      plain[z] = 0;
    }
  }
  int64_t sum = 0;
  for (size_t i = 0; i <= plain.size(); ++i) {
    REQUIRE(f.Prefix(i) == sum);
    if (i < plain.size()) sum += plain[i];
  }
  // Every unit of weight maps to the element holding it.
  int64_t r = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    for (int64_t k = 0; k < plain[i]; ++k, ++r) REQUIRE(f.Find(r) == i);
  }
}

TEST_CASE("uniform draws are seeded, with replacement, and only from admitted groups") {
  std::vector<GroupPtr> groups;
  // Versions 1..40; seq 5, 10, ... have zero variance.
  for (int64_t seq = 1; seq <= 40; ++seq) {
    groups.push_back(seq % 5 == 0 ? Group(seq, {2, 2}, seq) : Group(seq, {0, 1}, seq));
  }
  SampleIndex index = Index(groups);
  REQUIRE(index.size() == 40);
  Selection a = index.Select(SAMPLE_UNIFORM, 7, 20, {/*min_policy_version=*/11, /*skip_zero_variance=*/true});
  REQUIRE(a.picked.size() == 20);
  CHECK(a.skipped == 40 - 24);  // versions 11..40 less the six flat ones
  CHECK(index.Select(SAMPLE_UNIFORM, 7, 25, {11, true}).picked.empty());  // only 24 qualify
  std::map<int64_t, int> counts;
  for (int64_t seq : Draws(index, SAMPLE_UNIFORM, 100, 20, 11, true)) ++counts[seq];
  CHECK(counts.size() == 24);  // every admitted group is reachable...
  CHECK(counts.begin()->first >= 11);
  for (const auto& [seq, n] : counts) {
    CHECK(seq % 5 != 0);  // ...and no other
    CHECK(n > 40);        // ~83 each
    CHECK(n < 140);
  }
  CHECK(Seqs(a) == Seqs(index.Select(SAMPLE_UNIFORM, 7, 20, {11, true})));
  CHECK(Seqs(a) != Seqs(index.Select(SAMPLE_UNIFORM, 8, 20, {11, true})));
  Selection all = index.Select(SAMPLE_UNIFORM, 7, 10, {0, false});
  CHECK(all.skipped == 0);
  CHECK(all.picked.size() == 10);
}

TEST_CASE("uniform picks depend on the set of groups and the seed, not on commit order or removals") {
  std::vector<GroupPtr> groups;
  for (int64_t seq = 1; seq <= 300; ++seq) {
    groups.push_back(Group(seq, {0, static_cast<double>(seq % 3)}, /*policy_version=*/seq / 50));
  }
  std::vector<GroupPtr> shuffled = groups;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(11));
  SampleIndex in_order = Index(groups);
  SampleIndex out_of_order = Index(shuffled);
  // A third index that also held 400 more groups, since removed: 200 in the
  // same versions (enough to compact those parts) and 200 in versions of
  // their own (enough to compact the buckets).
  auto extra = [](int64_t seq) { return Group(seq, {0, 1}, seq < 1200 ? seq / 50 - 18 : seq - 1100); };
  SampleIndex trimmed;
  for (int64_t seq = 1000; seq < 1400; ++seq) trimmed.Add(extra(seq));
  for (const auto& g : shuffled) trimmed.Add(g);
  for (int64_t seq = 1000; seq < 1400; ++seq) trimmed.Remove(*extra(seq));
  REQUIRE(trimmed.size() == 300);
  for (uint64_t seed : {1, 2, 3}) {
    const auto want = Seqs(in_order.Select(SAMPLE_UNIFORM, seed, 50, {2, true}));
    CHECK(want.size() == 50);
    CHECK(Seqs(out_of_order.Select(SAMPLE_UNIFORM, seed, 50, {2, true})) == want);
    CHECK(Seqs(trimmed.Select(SAMPLE_UNIFORM, seed, 50, {2, true})) == want);
  }
}

TEST_CASE("removed groups are never picked, and a removed bucket admits nothing") {
  std::vector<GroupPtr> groups;
  for (int64_t seq = 1; seq <= 100; ++seq) groups.push_back(Group(seq, {0, 1}, seq <= 50 ? 1 : 2));
  SampleIndex index = Index(groups);
  for (int64_t seq = 1; seq <= 100; seq += 2) index.Remove(*groups[seq - 1]);
  index.Remove(*groups[0]);  // twice: ignored
  CHECK(index.size() == 50);
  for (SampleMode mode : {SAMPLE_UNIFORM, SAMPLE_PRIORITIZED}) {
    const std::vector<int64_t> seqs = Draws(index, mode, 20, 50, 0, false);
    REQUIRE(seqs.size() == 1000);
    for (int64_t seq : seqs) CHECK(seq % 2 == 0);
  }
  for (int64_t seq = 2; seq <= 50; seq += 2) index.Remove(*groups[seq - 1]);
  Selection v2 = index.Select(SAMPLE_UNIFORM, 5, 25, {0, false});
  REQUIRE(v2.picked.size() == 25);
  for (int64_t seq : Seqs(v2)) CHECK(seq > 50);
  CHECK(index.Select(SAMPLE_UNIFORM, 5, 26, {0, false}).picked.empty());
}

TEST_CASE("random modes pick nothing when fewer groups qualify than asked for") {
  SampleIndex index = Index({Group(1, {0, 1}), Group(2, {0, 1}), Group(3, {0, 1})});
  Selection u = index.Select(SAMPLE_UNIFORM, 1, 4, {0, false});
  CHECK(u.picked.empty());
  Selection p = index.Select(SAMPLE_PRIORITIZED, 1, 4, {0, false});
  CHECK(p.picked.empty());
  CHECK(p.skipped == 0);
  Selection newer = index.Select(SAMPLE_UNIFORM, 1, 1, {/*min_policy_version=*/2, false});
  CHECK(newer.picked.empty());
  CHECK(newer.skipped == 3);
}

TEST_CASE("prioritized draws follow reward variance") {
  // 100 groups of each: variance 0.25 ({0, 1}), 0.0625 ({0, 0.5}), 0 ({3, 3}).
  std::vector<GroupPtr> groups;
  for (int64_t i = 0; i < 100; ++i) {
    groups.push_back(Group(3 * i + 1, {0, 1}));
    groups.push_back(Group(3 * i + 2, {0, 0.5}));
    groups.push_back(Group(3 * i + 3, {3, 3}));
  }
  SampleIndex index = Index(groups);
  const std::vector<int64_t> seqs = Draws(index, SAMPLE_PRIORITIZED, 10, 300, 0, false);
  REQUIRE(seqs.size() == 3000);
  int high = 0, mid = 0, zero = 0;
  for (int64_t seq : seqs) {
    if (seq % 3 == 1) {
      ++high;
    } else if (seq % 3 == 2) {
      ++mid;
    } else {
      ++zero;
    }
  }
  // Expected shares 0.25 / 0.3125 = 80% and 20%; zero variance ~4e-6 each.
  CHECK(zero <= 1);
  CHECK(high > 2280);
  CHECK(high < 2520);
  CHECK(mid > 480);
  CHECK(seqs == Draws(index, SAMPLE_PRIORITIZED, 10, 300, 0, false));
  // Only flat groups left: the floor makes them equally likely.
  SampleIndex flat = Index({Group(1, {3, 3}), Group(2, {1, 1})});
  std::map<int64_t, int> counts;
  for (int64_t seq : Draws(flat, SAMPLE_PRIORITIZED, 500, 2, 0, false)) ++counts[seq];
  CHECK(counts[1] > 400);
  CHECK(counts[2] > 400);
}

}  // namespace rlmesh::replay
