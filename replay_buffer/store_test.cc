// ReplayStore driven directly (no gRPC): durability across reopen, idempotent
// puts, validation, the three sample modes and their guarantees, trim +
// reopen, and concurrent use. Query, trim and export: store_query_test.cc.
#include "replay_buffer/store.h"

#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"
#include "replay_buffer/testing/store_testing.h"

namespace rlmesh {
namespace {

using replay_testing::Fifo;
using replay_testing::GroupIds;
using replay_testing::MakeGroup;
using replay_testing::OpenStore;
using replay_testing::Q;
using replay_testing::Req;
using replay_testing::Soon;

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

TEST_CASE("a stored record is the sample with its group's ids and step, set or not in the sample") {
  TrajectoryGroup g = MakeGroup("exp", 7, "grp", {0, 1, 0.5, 1});
  (*g.mutable_samples(0)->mutable_reward_components())["accuracy"] = 1;
  g.mutable_samples(1)->set_experiment_id("exp");  // already the group's
  g.mutable_samples(1)->set_step(7);
  g.mutable_samples(2)->set_group_id("grp");
  g.mutable_samples(2)->set_prompt_id(g.prompt_id());
  REQUIRE(ValidateGroup(g, 0, ReplayStoreOptions{}).ok());
  TrajectoryGroup zero_step = MakeGroup("exp", 0, "g0", {1});
  zero_step.clear_prompt_id();
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(store->PutGroups(Req({zero_step, g})).ok());
  auto q = store->Query(Q("exp"));
  REQUIRE(q.ok());
  // Query orders by (step, group, sample): zero_step's one sample, then g's.
  std::vector<std::pair<const TrajectoryGroup*, const Trajectory*>> sent;
  for (const TrajectoryGroup* group : {&zero_step, &g}) {
    for (const Trajectory& t : group->samples()) sent.emplace_back(group, &t);
  }
  REQUIRE(q->trajectories_size() == static_cast<int>(sent.size()));
  for (size_t i = 0; i < sent.size(); ++i) {
    const auto& [group, t] = sent[i];
    Trajectory want = *t;
    want.set_experiment_id(group->experiment_id());
    want.set_group_id(group->group_id());
    want.set_prompt_id(group->prompt_id());
    want.set_step(group->step());
    const Trajectory& got = q->trajectories(static_cast<int>(i));
    CAPTURE(i);
    CHECK(got.experiment_id() == "exp");
    CHECK(got.group_id() == group->group_id());
    CHECK(got.step() == group->step());
    // Everything else too: the same message, field for field.
    CHECK(got.DebugString() == want.DebugString());
  }
}

TEST_CASE("a request lands whole: a conflicting or repeated group writes none of its groups") {
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  REQUIRE(store->PutGroups(Req({MakeGroup("e", 1, "a", {0, 1})})).ok());
  // "b" is new, "a" conflicts with the stored one: neither is written.
  auto a = MakeGroup("e", 1, "a", {0, 1});
  a.mutable_samples(1)->set_trajectory_id("other");
  auto conflict = store->PutGroups(Req({MakeGroup("e", 1, "b", {0, 1}), a}));
  CHECK(conflict.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(conflict.status().message()).find("groups[1]: group_id 'a'") != std::string::npos);
  // The same group twice in one request, and one trajectory id in two groups.
  auto twice = store->PutGroups(Req({MakeGroup("e", 1, "c", {0, 1}), MakeGroup("e", 1, "c", {0, 1})}));
  CHECK(twice.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(twice.status().message()).find("groups[1].group_id 'c' repeats groups[0]") !=
        std::string::npos);
  auto shared = MakeGroup("e", 1, "d", {0, 1});
  shared.mutable_samples(0)->set_trajectory_id(MakeGroup("e", 1, "c", {0, 1}).samples(1).trajectory_id());
  auto crossed = store->PutGroups(Req({MakeGroup("e", 1, "c", {0, 1}), shared}));
  CHECK(crossed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(crossed.status().message()).find("groups[1].samples[0].trajectory_id") != std::string::npos);
  auto stats = store->Stats({});
  REQUIRE(stats.ok());
  CHECK(stats->experiments(0).groups() == 1);
  // A duplicate beside new groups: the new ones are written, in one batch.
  auto mixed = store->PutGroups(Req({MakeGroup("e", 2, "b", {0, 1}), MakeGroup("e", 1, "a", {0, 1}),
                                     MakeGroup("e", 2, "c", {1, 1})}));
  REQUIRE(mixed.ok());
  CHECK(mixed->written() == 2);
  CHECK(mixed->duplicates() == 1);
  auto q = store->Query(Q("e"));
  REQUIRE(q.ok());
  CHECK(q->trajectories_size() == 6);
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
  // Waits out the 200 ms lease: the condition is elapsed time itself (the
  // lease's deadline was set before SampleGroups returned).
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

// A `cancelled` callback that never cancels and notifies `waiting` the first
// time SampleGroups polls it, which it does only once it has found too few
// groups and is waiting for a commit.
std::function<bool()> NotifyWhenWaiting(absl::Notification* waiting) {
  return [waiting] {
    if (!waiting->HasBeenNotified()) waiting->Notify();
    return false;
  };
}

TEST_CASE("a waiting sample returns as soon as enough groups arrive") {
  testing::TempDir dir;
  auto store = OpenStore(dir.path());
  absl::Notification sampling;
  absl::Status put_g0 = absl::UnknownError("not run"), put_g1 = absl::UnknownError("not run");
  std::thread writer([&] {
    if (!sampling.WaitForNotificationWithTimeout(absl::Seconds(10))) return;
    put_g0 = store->PutGroups(Req({MakeGroup("late", 0, "g0", {0, 1})})).status();
    put_g1 = store->PutGroups(Req({MakeGroup("late", 0, "g1", {0, 1})})).status();
  });
  const absl::Time start = absl::Now();
  auto r = store->SampleGroups(Fifo("late", "L", 2), absl::Now() + absl::Seconds(10), NotifyWhenWaiting(&sampling));
  writer.join();
  CHECK(sampling.HasBeenNotified());
  CHECK(put_g0.ok());
  CHECK(put_g1.ok());
  REQUIRE(r.ok());
  CHECK(GroupIds(*r) == std::vector<std::string>{"g0", "g1"});
  CHECK(absl::Now() - start < absl::Seconds(5));

  // Shutdown wakes a waiter promptly.
  absl::Notification waiting;
  std::thread stopper([&] {
    // Without the notification (a failed wait) the sample times out and the
    // status check below fails.
    if (waiting.WaitForNotificationWithTimeout(absl::Seconds(10))) store->Shutdown();
  });
  const absl::Time t0 = absl::Now();
  auto w = store->SampleGroups(Fifo("late", "L", 5), absl::Now() + absl::Seconds(10), NotifyWhenWaiting(&waiting));
  stopper.join();
  CHECK(waiting.HasBeenNotified());
  CHECK(w.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::Now() - t0 < absl::Seconds(2));
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
