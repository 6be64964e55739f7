// ReplayStore's read side driven directly (no gRPC): query filters,
// pagination and aggregates; trim; export (moved from store_test.cc).
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
    // Policy version step + 1: Stats' version range follows the trims.
    REQUIRE(store->PutGroups(Req({MakeGroup("e", step, absl::StrCat("g", step), {0, 0.5, 1}, step + 1, "p"),
                                  MakeGroup("e", step, absl::StrCat("h", step), {0.2, 0.2}, step + 1,
                                            absl::StrCat("q", step))}))
                .ok());
  }
  {
    auto s = store->Stats({});
    REQUIRE(s.ok());
    CHECK(s->experiments(0).min_policy_version() == 1);
    CHECK(s->experiments(0).max_policy_version() == 5);
    // RocksDB's own accounting of the store's memory.
    CHECK(s->memory().block_cache_capacity() == ReplayStoreOptions().block_cache_bytes);
    CHECK(s->memory().block_cache_usage() <= s->memory().block_cache_capacity());
    CHECK(s->memory().memtables() > 0);  // the puts sit in memtables until a flush
    CHECK(s->memory().table_readers() >= 0);
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
    auto trimmed = store->Stats({});
    REQUIRE(trimmed.ok());
    CHECK(trimmed->experiments(0).min_policy_version() == 4);
    CHECK(trimmed->experiments(0).max_policy_version() == 5);
    store.reset();
    store = OpenStore(dir.path());
    auto s = store->Stats({});
    REQUIRE(s.ok());
    CHECK(s->experiments(0).groups() == 4);
    CHECK(s->experiments(0).min_step() == 3);
    CHECK(s->experiments(0).min_policy_version() == 4);
    CHECK(s->experiments(0).max_policy_version() == 5);
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

}  // namespace
}  // namespace rlmesh
