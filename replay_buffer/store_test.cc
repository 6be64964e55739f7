// ReplayStore driven directly (no gRPC): durability across reopen, idempotent
// puts, validation, the three sample modes and their guarantees, query
// filters/pagination/aggregates, trim, export, and concurrent use.
#include "replay_buffer/store.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

// A group of `rewards.size()` samples; sample j has a response of 2 + j
// tokens and finish reason STOP (LENGTH for odd j).
TrajectoryGroup MakeGroup(const std::string& exp, int64_t step, const std::string& gid,
                          std::vector<double> rewards, int64_t version = 1,
                          const std::string& prompt = "") {
  TrajectoryGroup g;
  g.set_experiment_id(exp);
  g.set_step(step);
  g.set_group_id(gid);
  g.set_prompt_id(prompt.empty() ? "p-" + gid : prompt);
  for (size_t j = 0; j < rewards.size(); ++j) {
    Trajectory* t = g.add_samples();
    t->set_trajectory_id(absl::StrCat(exp, "/", step, "/", gid, "/", j));
    t->set_sample_index(j);
    t->set_policy_version(version);
    t->set_reward(rewards[j]);
    t->set_finish_reason(j % 2 ? FINISH_REASON_LENGTH : FINISH_REASON_STOP);
    t->add_prompt_token_ids(7);
    t->add_prompt_token_ids(8);
    for (size_t k = 0; k < 2 + j; ++k) {
      t->add_response_token_ids(100 + k);
      t->add_loss_mask(1);
      t->add_behaviour_logprobs(-0.5f);
    }
    t->set_response_text(absl::StrCat("answer ", gid, " #", j));
  }
  return g;
}

PutGroupsRequest Req(std::vector<TrajectoryGroup> groups) {
  PutGroupsRequest r;
  for (auto& g : groups) *r.add_groups() = std::move(g);
  return r;
}

std::unique_ptr<ReplayStore> OpenStore(const std::string& path,
                                       ReplayStoreOptions options = {}) {
  options.db_path = path;
  auto store = ReplayStore::Open(options);
  REQUIRE(store.ok());
  return *std::move(store);
}

absl::Time Soon(int ms = 2000) { return absl::Now() + absl::Milliseconds(ms); }

SampleGroupsRequest Fifo(const std::string& exp, const std::string& consumer, int n,
                         bool ack = false) {
  SampleGroupsRequest r;
  r.set_experiment_id(exp);
  r.set_consumer_id(consumer);
  r.set_mode(SAMPLE_FIFO);
  r.set_num_groups(n);
  r.set_require_ack(ack);
  return r;
}

std::vector<std::string> GroupIds(const SampleGroupsResponse& r) {
  std::vector<std::string> ids;
  for (const auto& g : r.groups()) ids.push_back(g.group_id());
  return ids;
}

QueryRequest Q(const std::string& exp, int limit = 0) {
  QueryRequest q;
  q.mutable_filter()->set_experiment_id(exp);
  q.set_limit(limit);
  return q;
}

TEST_CASE("put is durable across reopen, whole groups, idempotent by trajectory id") {
  testing::TempDir dir;
  {
    auto store = OpenStore(dir.path());
    auto r = store->PutGroups(Req({MakeGroup("e", 1, "a", {0, 1, 1}), MakeGroup("e", 2, "b", {1})}));
    REQUIRE(r.ok());
    CHECK(r->written() == 2);
    CHECK(r->duplicates() == 0);
    // A retried call writes nothing new.
    auto again = store->PutGroups(Req({MakeGroup("e", 1, "a", {0, 1, 1})}));
    REQUIRE(again.ok());
    CHECK(again->written() == 0);
    CHECK(again->duplicates() == 1);
  }
  auto store = OpenStore(dir.path());
  auto q = store->Query(Q("e"));
  REQUIRE(q.ok());
  REQUIRE(q->trajectories_size() == 4);
  CHECK(q->trajectories(0).trajectory_id() == "e/1/a/0");
  CHECK(q->trajectories(2).trajectory_id() == "e/1/a/2");
  CHECK(q->trajectories(3).trajectory_id() == "e/2/b/0");
  // Filled in from the group.
  CHECK(q->trajectories(3).experiment_id() == "e");
  CHECK(q->trajectories(3).group_id() == "b");
  CHECK(q->trajectories(3).step() == 2);
  CHECK(q->trajectories(1).response_token_ids_size() == 3);
  CHECK(q->next_page_token().empty());

  auto dup = store->PutGroups(Req({MakeGroup("e", 2, "b", {1})}));
  REQUIRE(dup.ok());
  CHECK(dup->duplicates() == 1);
  // Same group id with different trajectory ids is a conflict, not a duplicate.
  auto other = MakeGroup("e", 2, "b", {1});
  other.mutable_samples(0)->set_trajectory_id("something-else");
  auto conflict = store->PutGroups(Req({other}));
  CHECK(conflict.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(conflict.status().message()).find("group_id") != std::string::npos);

  auto stats = store->Stats({});
  REQUIRE(stats.ok());
  REQUIRE(stats->experiments_size() == 1);
  CHECK(stats->experiments(0).groups() == 2);
  CHECK(stats->experiments(0).trajectories() == 4);
  CHECK(stats->experiments(0).min_step() == 1);
  CHECK(stats->experiments(0).max_step() == 2);
  CHECK(stats->experiments(0).bytes() > 0);
}

TEST_CASE("bad input is INVALID_ARGUMENT naming the field, and nothing is written") {
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  struct Case {
    std::string name;
    std::function<void(TrajectoryGroup&)> mutate;
    std::string field;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Case> cases = {
      {"empty group", [](TrajectoryGroup& g) { g.clear_samples(); }, "groups[1].samples"},
      {"no experiment", [](TrajectoryGroup& g) { g.clear_experiment_id(); },
       "groups[1].experiment_id"},
      {"no group id", [](TrajectoryGroup& g) { g.clear_group_id(); }, "groups[1].group_id"},
      {"no trajectory id", [](TrajectoryGroup& g) { g.mutable_samples(1)->clear_trajectory_id(); },
       "groups[1].samples[1].trajectory_id"},
      {"mask length", [](TrajectoryGroup& g) { g.mutable_samples(0)->add_loss_mask(1); },
       "groups[1].samples[0].loss_mask"},
      {"logprob length",
       [](TrajectoryGroup& g) { g.mutable_samples(1)->mutable_behaviour_logprobs()->RemoveLast(); },
       "groups[1].samples[1].behaviour_logprobs"},
      {"NaN reward", [&](TrajectoryGroup& g) { g.mutable_samples(0)->set_reward(nan); },
       "groups[1].samples[0].reward"},
      {"Inf reward", [&](TrajectoryGroup& g) { g.mutable_samples(1)->set_reward(-inf); },
       "groups[1].samples[1].reward"},
      {"Inf component",
       [&](TrajectoryGroup& g) { (*g.mutable_samples(0)->mutable_reward_components())["fmt"] = inf; },
       "reward_components['fmt']"},
      {"sample index", [](TrajectoryGroup& g) { g.mutable_samples(1)->set_sample_index(5); },
       "groups[1].samples[1].sample_index"},
      {"other experiment", [](TrajectoryGroup& g) { g.mutable_samples(0)->set_experiment_id("x"); },
       "groups[1].samples[0].experiment_id"},
      {"negative step", [](TrajectoryGroup& g) { g.set_step(-1); }, "groups[1].step"},
      {"oversized",
       [](TrajectoryGroup& g) { g.mutable_samples(0)->set_response_text(std::string(40 << 20, 'x')); },
       "max_group_bytes"},
      {"repeated id",
       [](TrajectoryGroup& g) {
         g.mutable_samples(1)->set_trajectory_id(g.samples(0).trajectory_id());
       },
       "repeats"},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      TrajectoryGroup bad = MakeGroup("e", 1, "bad", {0, 1});
      c.mutate(bad);
      // The first group is fine; it must not be written either.
      auto r = store->PutGroups(Req({MakeGroup("e", 1, "good", {1}), bad}));
      REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(r.status().message()), Catch::Contains(c.field));
      StatsRequest s;
      s.set_experiment_id("e");
      CHECK(store->Stats(s).status().code() == absl::StatusCode::kInvalidArgument);
    }
  }
  SECTION("empty request") {
    CHECK(store->PutGroups({}).status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("reads of an unknown experiment") {
    auto q = store->Query(Q("nope"));
    CHECK(q.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(q.status().message()), Catch::Contains("experiment_id"));
    TrimRequest t;
    t.set_experiment_id("nope");
    t.set_keep_steps(1);
    CHECK(store->Trim(t).status().code() == absl::StatusCode::kInvalidArgument);
    ExportRequest ex;
    ex.mutable_filter()->set_experiment_id("nope");
    CHECK(store->Export(ex, [](ExportChunk&) { return true; }).code() ==
          absl::StatusCode::kInvalidArgument);
  }
  SECTION("bad sample arguments") {
    auto r = store->SampleGroups(Fifo("e", "", 1), Soon(10));
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(r.status().message()), Catch::Contains("consumer_id"));
    r = store->SampleGroups(Fifo("e", "c", 0), Soon(10));
    CHECK_THAT(std::string(r.status().message()), Catch::Contains("num_groups"));
  }
}

TEST_CASE("FIFO without ack: at-most-once, cursor persisted, nothing consumed on a short read") {
  testing::TempDir dir;
  {
    auto store = OpenStore(dir.path());
    for (int i = 0; i < 5; ++i) {
      REQUIRE(store->PutGroups(Req({MakeGroup("e", i, absl::StrCat("g", i), {0, 1})})).ok());
    }
    auto r = store->SampleGroups(Fifo("e", "learner", 2), Soon());
    REQUIRE(r.ok());
    CHECK(GroupIds(*r) == std::vector<std::string>{"g0", "g1"});
    CHECK(r->ack_token().empty());
    // Another consumer has its own cursor.
    auto other = store->SampleGroups(Fifo("e", "eval", 1), Soon());
    REQUIRE(other.ok());
    CHECK(GroupIds(*other) == std::vector<std::string>{"g0"});
  }
  auto store = OpenStore(dir.path());
  auto r = store->SampleGroups(Fifo("e", "learner", 2), Soon());
  REQUIRE(r.ok());
  CHECK(GroupIds(*r) == std::vector<std::string>{"g2", "g3"});
  // Only one left: wait until the deadline, then say so, consuming nothing.
  const absl::Time start = absl::Now();
  auto short_read = store->SampleGroups(Fifo("e", "learner", 2), absl::Now() + absl::Milliseconds(300));
  CHECK(short_read.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - start >= absl::Milliseconds(250));
  auto last = store->SampleGroups(Fifo("e", "learner", 1), Soon());
  REQUIRE(last.ok());
  CHECK(GroupIds(*last) == std::vector<std::string>{"g4"});
  auto stats = store->Stats({});
  REQUIRE(stats.ok());
  CHECK(stats->experiments(0).consumed().at("learner") == 5);
  CHECK(stats->experiments(0).consumed().at("eval") == 1);
}

TEST_CASE("FIFO with ack: at-least-once; an acknowledged ack is final") {
  testing::TempDir dir;
  std::string token_g0g1;
  std::string token_g2;
  {
    auto store = OpenStore(dir.path());
    for (int i = 0; i < 4; ++i) {
      REQUIRE(store->PutGroups(Req({MakeGroup("e", i, absl::StrCat("g", i), {0, 1})})).ok());
    }
    auto a = store->SampleGroups(Fifo("e", "L", 2, true), Soon());
    REQUIRE(a.ok());
    CHECK(GroupIds(*a) == std::vector<std::string>{"g0", "g1"});
    REQUIRE(!a->ack_token().empty());
    token_g0g1 = a->ack_token();
    // Leased groups are not handed out twice while the lease is live.
    auto b = store->SampleGroups(Fifo("e", "L", 1, true), Soon());
    REQUIRE(b.ok());
    CHECK(GroupIds(*b) == std::vector<std::string>{"g2"});
    token_g2 = b->ack_token();
    // Ack the later lease first (out of order); it must survive a restart.
    AckSampleRequest ack;
    ack.set_experiment_id("e");
    ack.set_consumer_id("L");
    ack.set_ack_token(token_g2);
    REQUIRE(store->AckSample(ack).ok());
    // A token is bound to its consumer.
    ack.set_consumer_id("other");
    CHECK(store->AckSample(ack).code() == absl::StatusCode::kInvalidArgument);
    ack.set_consumer_id("L");
    ack.set_ack_token("garbage!");
    CHECK(store->AckSample(ack).code() == absl::StatusCode::kInvalidArgument);
    std::string tampered = token_g2;
    tampered[3] = tampered[3] == 'A' ? 'B' : 'A';
    ack.set_ack_token(tampered);
    CHECK(store->AckSample(ack).code() == absl::StatusCode::kInvalidArgument);
  }
  // Restart: g0, g1 were never acked -> redelivered; g2 was acked -> never again.
  auto store = OpenStore(dir.path());
  auto again = store->SampleGroups(Fifo("e", "L", 3, true), Soon());
  REQUIRE(again.ok());
  CHECK(GroupIds(*again) == std::vector<std::string>{"g0", "g1", "g3"});
  AckSampleRequest ack;
  ack.set_experiment_id("e");
  ack.set_consumer_id("L");
  ack.set_ack_token(again->ack_token());
  REQUIRE(store->AckSample(ack).ok());
  REQUIRE(store->AckSample(ack).ok());  // idempotent
  // The token from before the restart is also fine (already covered).
  ack.set_ack_token(token_g0g1);
  CHECK(store->AckSample(ack).ok());
  auto none = store->SampleGroups(Fifo("e", "L", 1, true), absl::Now() + absl::Milliseconds(50));
  CHECK(none.status().code() == absl::StatusCode::kDeadlineExceeded);
  auto stats = store->Stats({});
  REQUIRE(stats.ok());
  CHECK(stats->experiments(0).consumed().at("L") == 4);
}

TEST_CASE("FIFO leases expire after ack_timeout and are redelivered") {
  testing::TempDir dir;
  ReplayStoreOptions options;
  options.ack_timeout = absl::Milliseconds(200);
  auto store = OpenStore(dir.path(), options);
  REQUIRE(store->PutGroups(Req({MakeGroup("e", 0, "g0", {0, 1}), MakeGroup("e", 0, "g1", {0, 1})}))
              .ok());
  auto a = store->SampleGroups(Fifo("e", "L", 1, true), Soon());
  REQUIRE(a.ok());
  CHECK(GroupIds(*a) == std::vector<std::string>{"g0"});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto b = store->SampleGroups(Fifo("e", "L", 2, true), Soon());
  REQUIRE(b.ok());
  CHECK(GroupIds(*b) == std::vector<std::string>{"g0", "g1"});
}

TEST_CASE("sample filters: staleness and zero variance") {
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(store
              ->PutGroups(Req({MakeGroup("e", 0, "old", {0, 1}, /*version=*/1),
                               MakeGroup("e", 0, "flat", {1, 1}, 5),
                               MakeGroup("e", 1, "good", {0, 1}, 5)}))
              .ok());
  auto req = Fifo("e", "L", 1);
  req.set_min_policy_version(3);
  req.set_skip_zero_variance(true);
  auto r = store->SampleGroups(req, Soon());
  REQUIRE(r.ok());
  CHECK(GroupIds(*r) == std::vector<std::string>{"good"});
  CHECK(r->skipped() == 2);

  // Uniform draws with replacement from groups passing the filters; it
  // waits until at least num_groups such groups exist.
  SampleGroupsRequest u;
  u.set_experiment_id("e");
  u.set_mode(SAMPLE_UNIFORM);
  u.set_num_groups(2);
  u.set_min_policy_version(3);
  std::set<std::string> seen;
  for (int seed = 0; seed < 20; ++seed) {
    u.set_seed(seed);
    auto ur = store->SampleGroups(u, Soon());
    REQUIRE(ur.ok());
    REQUIRE(ur->groups_size() == 2);
    for (const auto& id : GroupIds(*ur)) seen.insert(id);
    // Same seed, same draws.
    auto ur2 = store->SampleGroups(u, Soon());
    REQUIRE(ur2.ok());
    CHECK(GroupIds(*ur2) == GroupIds(*ur));
  }
  CHECK(seen == std::set<std::string>{"flat", "good"});
  u.set_num_groups(3);
  CHECK(store->SampleGroups(u, absl::Now() + absl::Milliseconds(50)).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("prioritized sampling favours high reward variance") {
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(store
              ->PutGroups(Req({MakeGroup("e", 0, "hi", {0, 1, 0, 1}),
                               MakeGroup("e", 0, "lo", {0.45, 0.55, 0.5, 0.5}),
                               MakeGroup("e", 0, "zero", {1, 1, 1, 1})}))
              .ok());
  SampleGroupsRequest p;
  p.set_experiment_id("e");
  p.set_mode(SAMPLE_PRIORITIZED);
  p.set_num_groups(3);
  std::map<std::string, int> n;
  for (int seed = 0; seed < 300; ++seed) {
    p.set_seed(seed);
    auto r = store->SampleGroups(p, Soon());
    REQUIRE(r.ok());
    for (const auto& id : GroupIds(*r)) ++n[id];
  }
  // Variances 0.25 vs 0.00125 vs 0: "hi" should take ~99.5% of 900 draws.
  CHECK(n["hi"] > 860);
  CHECK(n["lo"] < 30);
  CHECK(n["zero"] < 5);
  p.set_skip_zero_variance(true);
  p.set_num_groups(3);  // only 2 groups qualify -> waits, then deadline
  CHECK(store->SampleGroups(p, absl::Now() + absl::Milliseconds(50)).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("a waiting sample returns as soon as enough groups arrive") {
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    REQUIRE(store->PutGroups(Req({MakeGroup("late", 0, "g0", {0, 1})})).ok());
    REQUIRE(store->PutGroups(Req({MakeGroup("late", 0, "g1", {0, 1})})).ok());
  });
  const absl::Time start = absl::Now();
  auto r = store->SampleGroups(Fifo("late", "L", 2), absl::Now() + absl::Seconds(10));
  writer.join();
  REQUIRE(r.ok());
  CHECK(GroupIds(*r) == std::vector<std::string>{"g0", "g1"});
  CHECK(absl::Now() - start < absl::Seconds(5));

  // Shutdown wakes a waiter promptly.
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    store->Shutdown();
  });
  const absl::Time t0 = absl::Now();
  auto w = store->SampleGroups(Fifo("late", "L", 5), absl::Now() + absl::Seconds(10));
  stopper.join();
  CHECK(w.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::Now() - t0 < absl::Seconds(2));
}

TEST_CASE("query: filters, pagination with opaque tokens, aggregates") {
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  // step 1: groups A (rewards 0,1,1) and B (0,0); step 2: C (1,1) v3, prompt shared with A.
  REQUIRE(store
              ->PutGroups(Req({MakeGroup("e", 1, "A", {0, 1, 1}, 1, "p1"),
                               MakeGroup("e", 1, "B", {0, 0}, 2, "p2"),
                               MakeGroup("e", 2, "C", {1, 1}, 3, "p1")}))
              .ok());
  auto ids = [](const QueryResponse& r) {
    std::vector<std::string> out;
    for (const auto& t : r.trajectories()) out.push_back(t.trajectory_id());
    return out;
  };
  SECTION("filters") {
    auto q = Q("e");
    q.mutable_filter()->set_has_reward_range(true);
    q.mutable_filter()->set_min_reward(0.5);
    q.mutable_filter()->set_max_reward(2);
    auto r = store->Query(q);
    REQUIRE(r.ok());
    CHECK(ids(*r) == std::vector<std::string>{"e/1/A/1", "e/1/A/2", "e/2/C/0", "e/2/C/1"});

    q = Q("e");
    q.mutable_filter()->set_prompt_id("p1");
    q.mutable_filter()->set_finish_reason(FINISH_REASON_LENGTH);
    r = store->Query(q);
    REQUIRE(r.ok());
    CHECK(ids(*r) == std::vector<std::string>{"e/1/A/1", "e/2/C/1"});

    q = Q("e");
    q.mutable_filter()->set_min_policy_version(2);
    q.mutable_filter()->set_max_policy_version(2);
    r = store->Query(q);
    REQUIRE(r.ok());
    CHECK(ids(*r) == std::vector<std::string>{"e/1/B/0", "e/1/B/1"});

    q = Q("e");
    q.mutable_filter()->set_min_step(2);
    q.mutable_filter()->set_text_contains("C #1");
    r = store->Query(q);
    REQUIRE(r.ok());
    CHECK(ids(*r) == std::vector<std::string>{"e/2/C/1"});

    q = Q("e");
    q.mutable_filter()->set_min_step(3);
    q.mutable_filter()->set_max_step(2);
    CHECK_THAT(std::string(store->Query(q).status().message()), Catch::Contains("max_step"));
  }
  SECTION("pagination visits everything once, in order") {
    std::vector<std::string> all;
    auto q = Q("e", 2);
    int pages = 0;
    while (true) {
      auto r = store->Query(q);
      REQUIRE(r.ok());
      CHECK(r->trajectories_size() <= 2);
      for (const auto& id : ids(*r)) all.push_back(id);
      ++pages;
      if (r->next_page_token().empty()) break;
      q.set_page_token(r->next_page_token());
      REQUIRE(pages < 10);
    }
    CHECK(pages == 4);
    CHECK(all == std::vector<std::string>{"e/1/A/0", "e/1/A/1", "e/1/A/2", "e/1/B/0", "e/1/B/1",
                                          "e/2/C/0", "e/2/C/1"});
  }
  SECTION("bad page tokens") {
    auto q = Q("e", 2);
    auto first = store->Query(q);
    REQUIRE(first.ok());
    std::string token = first->next_page_token();
    REQUIRE(!token.empty());
    q.set_page_token("not a token");
    CHECK_THAT(std::string(store->Query(q).status().message()), Catch::Contains("page_token"));
    std::string tampered = token;
    tampered[5] = tampered[5] == 'A' ? 'B' : 'A';
    q.set_page_token(tampered);
    CHECK(store->Query(q).status().code() == absl::StatusCode::kInvalidArgument);
    q.set_page_token(token);
    q.mutable_filter()->set_min_step(2);  // a token from another filter
    CHECK_THAT(std::string(store->Query(q).status().message()), Catch::Contains("page_token"));
  }
  SECTION("aggregates") {
    auto q = Q("e", 1);
    q.set_with_aggregates(true);
    auto r = store->Query(q);
    REQUIRE(r.ok());
    REQUIRE(r->aggregates_size() == 2);
    const StepAggregate& s1 = r->aggregates(0);
    CHECK(s1.step() == 1);
    CHECK(s1.count() == 5);
    CHECK(s1.groups() == 2);
    CHECK(s1.reward_mean() == Approx(0.4));
    CHECK(s1.reward_std() == Approx(std::sqrt(0.4 - 0.16)));
    CHECK(s1.pass_at_k() == Approx(0.5));  // p1 passes, p2 does not
    CHECK(s1.zero_variance_rate() == Approx(0.5));  // B is all zeros
    CHECK(s1.length_min() == 2);
    CHECK(s1.length_max() == 4);
    CHECK(s1.length_mean() == Approx((2 + 3 + 4 + 2 + 3) / 5.0));
    const StepAggregate& s2 = r->aggregates(1);
    CHECK(s2.count() == 2);
    CHECK(s2.pass_at_k() == Approx(1.0));
    CHECK(s2.zero_variance_rate() == Approx(1.0));
  }
}

TEST_CASE("trim by steps and bytes; export JSONL trajectories, SFT and DPO") {
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  for (int step = 0; step < 5; ++step) {
    REQUIRE(store->PutGroups(Req({MakeGroup("e", step, absl::StrCat("g", step), {0, 0.5, 1}, 1, "p"),
                                  MakeGroup("e", step, absl::StrCat("h", step), {0.2, 0.2}, 1,
                                            absl::StrCat("q", step))}))
                .ok());
  }
  SECTION("export") {
    auto run = [&](ExportFormat format) {
      ExportRequest ex;
      ex.mutable_filter()->set_experiment_id("e");
      ex.set_format(format);
      std::vector<nlohmann::json> lines;
      int records = 0;
      REQUIRE(store
                  ->Export(ex,
                           [&](ExportChunk& c) {
                             records += c.records();
                             std::istringstream in(c.jsonl());
                             std::string line;
                             while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
                             return true;
                           })
                  .ok());
      CHECK(records == static_cast<int>(lines.size()));
      return lines;
    };
    auto all = run(EXPORT_TRAJECTORIES);
    CHECK(all.size() == 25);
    CHECK(all[0]["trajectory_id"] == "e/0/g0/0");
    auto sft = run(EXPORT_SFT);
    // Prompts: p (shared by g0..g4) and q0..q4.
    REQUIRE(sft.size() == 6);
    CHECK(sft[0]["prompt_id"] == "p");
    CHECK(sft[0]["reward"] == 1.0);
    CHECK(sft[0]["response_token_ids"].size() == 4);  // sample 2 has 4 tokens
    auto dpo = run(EXPORT_DPO);
    REQUIRE(dpo.size() == 5);  // h* groups have equal rewards: no pair
    CHECK(dpo[0]["chosen_reward"] == 1.0);
    CHECK(dpo[0]["rejected_reward"] == 0.0);
    CHECK(dpo[0]["chosen_token_ids"].size() == 4);
    CHECK(dpo[0]["rejected_token_ids"].size() == 2);
    // A sink that stops cancels the export.
    ExportRequest ex;
    ex.mutable_filter()->set_experiment_id("e");
    ReplayStoreOptions small;
    CHECK(store->Export(ex, [](ExportChunk&) { return false; }).code() ==
          absl::StatusCode::kCancelled);
  }
  SECTION("trim keep_steps, survives reopen") {
    TrimRequest t;
    t.set_experiment_id("e");
    t.set_keep_steps(2);
    auto r = store->Trim(t);
    REQUIRE(r.ok());
    CHECK(r->groups_removed() == 6);
    CHECK(r->trajectories_removed() == 15);
    store.reset();
    store = OpenStore(dir.path());
    auto s = store->Stats({});
    REQUIRE(s.ok());
    CHECK(s->experiments(0).groups() == 4);
    CHECK(s->experiments(0).min_step() == 3);
    // A trimmed group may be written again (its idempotency keys went with it).
    auto again = store->PutGroups(Req({MakeGroup("e", 0, "g0", {0, 0.5, 1}, 1, "p")}));
    REQUIRE(again.ok());
    CHECK(again->written() == 1);
  }
  SECTION("trim max_bytes drops oldest steps first") {
    auto before = store->Stats({});
    REQUIRE(before.ok());
    const int64_t per_step = before->experiments(0).bytes() / 5;
    TrimRequest t;
    t.set_experiment_id("e");
    t.set_max_bytes(per_step * 3 + per_step / 2);
    auto r = store->Trim(t);
    REQUIRE(r.ok());
    auto s = store->Stats({});
    REQUIRE(s.ok());
    CHECK(s->experiments(0).min_step() == 2);
    CHECK(s->experiments(0).bytes() <= t.max_bytes());
    CHECK(store->Query(Q("e")).value().trajectories(0).step() == 2);
  }
}

TEST_CASE("FIFO cursor is never reused after trim + reopen") {
  testing::TempDir dir;
  {
    auto store = OpenStore(dir.path());
    REQUIRE(store->PutGroups(Req({MakeGroup("e", 0, "a", {0, 1}), MakeGroup("e", 1, "b", {0, 1})}))
                .ok());
    REQUIRE(store->SampleGroups(Fifo("e", "L", 2), Soon()).ok());
    TrimRequest t;
    t.set_experiment_id("e");
    t.set_keep_steps(0);
    t.set_max_bytes(1);
    REQUIRE(store->Trim(t).ok());
  }
  auto store = OpenStore(dir.path());
  REQUIRE(store->PutGroups(Req({MakeGroup("e", 2, "c", {0, 1})})).ok());
  auto r = store->SampleGroups(Fifo("e", "L", 1), Soon());
  REQUIRE(r.ok());
  CHECK(GroupIds(*r) == std::vector<std::string>{"c"});
}

TEST_CASE("many writers and readers at once") {
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  constexpr int kWriters = 6;
  constexpr int kPerWriter = 40;
  std::atomic<bool> writing{true};
  std::atomic<int> reader_errors{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < kPerWriter; ++i) {
        auto g = MakeGroup("c", i, absl::StrCat("w", w, "-", i), {double(i % 2), 1});
        auto r = store->PutGroups(Req({g}));
        REQUIRE(r.ok());
        // Every writer also retries one of its groups: must be a duplicate.
        if (i % 10 == 0) CHECK(store->PutGroups(Req({g}))->duplicates() == 1);
      }
    });
  }
  // The same group from several threads at once: exactly one write.
  std::atomic<int> written{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      auto r = store->PutGroups(Req({MakeGroup("c", 0, "contended", {0, 1})}));
      REQUIRE(r.ok());
      written += r->written();
    });
  }
  // Two FIFO threads share one consumer: they must never get the same group.
  std::mutex fifo_mu;
  std::multiset<std::string> fifo_seen;
  std::vector<std::thread> readers;
  for (int k = 0; k < 2; ++k) {
    readers.emplace_back([&] {
      while (true) {
        auto r = store->SampleGroups(Fifo("c", "shared", 3), absl::Now() + absl::Milliseconds(300));
        if (!r.ok()) {
          if (!writing) break;
          continue;
        }
        std::lock_guard<std::mutex> l(fifo_mu);
        for (const auto& g : r->groups()) {
          CHECK(g.samples_size() == 2);
          fifo_seen.insert(g.group_id());
        }
      }
    });
  }
  for (int k = 0; k < 2; ++k) {
    readers.emplace_back([&] {
      int i = 0;
      while (writing) {
        auto q = Q("c", 50);
        q.set_with_aggregates(i++ % 2 == 0);
        auto r = store->Query(q);
        if (!r.ok()) ++reader_errors;
        SampleGroupsRequest u;
        u.set_experiment_id("c");
        u.set_mode(SAMPLE_UNIFORM);
        u.set_num_groups(1);
        auto s = store->SampleGroups(u, absl::Now() + absl::Milliseconds(200));
        if (s.ok() && s->groups(0).samples_size() != 2) ++reader_errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  writing = false;
  for (auto& t : readers) t.join();
  CHECK(reader_errors == 0);
  CHECK(written == 1);
  auto s = store->Stats({});
  REQUIRE(s.ok());
  CHECK(s->experiments(0).groups() == kWriters * kPerWriter + 1);
  // The FIFO consumers drained everything exactly once (waiting until the
  // deadline for the tail); no duplicates.
  for (const auto& id : fifo_seen) CHECK(fifo_seen.count(id) == 1);
  auto rest = store->SampleGroups(Fifo("c", "shared", 1), absl::Now() + absl::Milliseconds(50));
  int drained = static_cast<int>(fifo_seen.size());
  while (rest.ok()) {
    ++drained;
    rest = store->SampleGroups(Fifo("c", "shared", 1), absl::Now() + absl::Milliseconds(50));
  }
  CHECK(drained == kWriters * kPerWriter + 1);
}

}  // namespace
}  // namespace rlmesh
