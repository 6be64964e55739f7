// The replay store's selection logic on hand-made catalogs: no RocksDB.

#include "replay_buffer/sampler.h"

#include <map>
#include <memory>
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

const Accept kAll = [](const GroupSummary&) { return true; };

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
  for (int64_t seq = 1; seq <= 6; ++seq) by_seq[seq] = Group(seq, {0, 0}, /*policy_version=*/seq);
  // Only even versions pass; seq 5 and above may still be being written.
  const Accept even = [](const GroupSummary& g) { return g.min_policy_version() % 2 == 0; };
  Selection s = SelectFifo(by_seq, 1, /*visible_limit=*/5, {}, 10, even);
  CHECK(Seqs(s) == std::vector<int64_t>{2, 4});
  CHECK(s.skipped == 2);
  CHECK(s.end_seq == 5);
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

TEST_CASE("uniform draws are seeded, with replacement, and only from accepted groups") {
  std::map<int64_t, GroupPtr> by_seq;
  for (int64_t seq = 1; seq <= 40; ++seq) by_seq[seq] = Group(seq, {static_cast<double>(seq)});
  const Accept low = [](const GroupSummary& g) { return g.seq <= 30; };
  Selection a = SelectRandom(by_seq, SAMPLE_UNIFORM, 7, 30, low);
  Selection b = SelectRandom(by_seq, SAMPLE_UNIFORM, 7, 30, low);
  REQUIRE(a.picked.size() == 30);
  CHECK(Seqs(a) == Seqs(b));
  CHECK(a.skipped == 10);
  std::map<int64_t, int> counts;
  for (int64_t seq : Seqs(a)) ++counts[seq];
  CHECK(counts.rbegin()->first <= 30);
  CHECK(counts.size() < 30);  // 30 draws with replacement from 30 repeat some group
  Selection c = SelectRandom(by_seq, SAMPLE_UNIFORM, 8, 30, low);
  CHECK(Seqs(a) != Seqs(c));
}

TEST_CASE("random modes pick nothing when fewer groups qualify than asked for") {
  std::map<int64_t, GroupPtr> by_seq;
  for (int64_t seq = 1; seq <= 3; ++seq) by_seq[seq] = Group(seq, {0, 1});
  Selection u = SelectRandom(by_seq, SAMPLE_UNIFORM, 1, 4, kAll);
  CHECK(u.picked.empty());
  Selection p = SelectRandom(by_seq, SAMPLE_PRIORITIZED, 1, 4, kAll);
  CHECK(p.picked.empty());
  CHECK(p.skipped == 0);
}

TEST_CASE("prioritized draws follow reward variance") {
  // 100 groups of each: variance 0.25 ({0, 1}), 0.0625 ({0, 0.5}), 0 ({3, 3}).
  std::map<int64_t, GroupPtr> by_seq;
  for (int64_t i = 0; i < 100; ++i) {
    by_seq[3 * i + 1] = Group(3 * i + 1, {0, 1});
    by_seq[3 * i + 2] = Group(3 * i + 2, {0, 0.5});
    by_seq[3 * i + 3] = Group(3 * i + 3, {3, 3});
  }
  Selection s = SelectRandom(by_seq, SAMPLE_PRIORITIZED, 42, 300, kAll);
  REQUIRE(s.picked.size() == 300);
  int high = 0, mid = 0, zero = 0;
  for (const auto& g : s.picked) {
    if (g->reward_variance() > 0.2) {
      ++high;
    } else if (g->reward_variance() > 0) {
      ++mid;
    } else {
      ++zero;
    }
  }
  // Expected shares 0.25 / 0.3125 = 80% and 20%; zero variance ~4e-6 each.
  CHECK(zero <= 1);
  CHECK(high > 210);
  CHECK(high < 270);
  CHECK(mid > 30);
  CHECK(Seqs(s) == Seqs(SelectRandom(by_seq, SAMPLE_PRIORITIZED, 42, 300, kAll)));
}

}  // namespace rlmesh::replay
