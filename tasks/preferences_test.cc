#include "tasks/preferences.h"

#include <fstream>
#include <set>

#include "absl/strings/numbers.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

std::vector<Example> Arith(int n) {
  TaskConfig c;
  c.set_kind("arithmetic");
  c.set_digits(2);
  c.set_train(n);
  c.set_eval(10);
  auto task = MakeTask(c, 7);
  REQUIRE(task.ok());
  return (*task)->train();
}

TEST_CASE("task pairs: chosen is the answer, rejected a nonzero offset within range") {
  const std::vector<Example> ex = Arith(200);
  TaskPairOptions o;
  o.seed = 3;
  o.max_offset = 4;
  auto pairs = MakeTaskPreferencePairs(ex, o);
  REQUIRE(pairs.ok());
  REQUIRE(pairs->size() == ex.size());
  std::set<int64_t> offsets;
  for (size_t i = 0; i < ex.size(); ++i) {
    const PreferencePair& p = (*pairs)[i];
    CHECK(p.prompt == ex[i].prompt);
    CHECK(p.chosen == ex[i].answer);
    int64_t a = 0, r = 0;
    REQUIRE(absl::SimpleAtoi(p.chosen, &a));
    REQUIRE(absl::SimpleAtoi(p.rejected, &r));
    CHECK(r != a);
    CHECK(std::abs(r - a) <= 4);
    offsets.insert(r - a);
  }
  // Both signs and every magnitude show up over 200 pairs.
  CHECK(offsets.size() == 8);
}

TEST_CASE("task pairs: seeded and deterministic") {
  const std::vector<Example> ex = Arith(50);
  TaskPairOptions o;
  o.seed = 11;
  auto a = MakeTaskPreferencePairs(ex, o);
  auto b = MakeTaskPreferencePairs(ex, o);
  o.seed = 12;
  auto c = MakeTaskPreferencePairs(ex, o);
  REQUIRE((a.ok() && b.ok() && c.ok()));
  int same_ab = 0, same_ac = 0;
  for (size_t i = 0; i < ex.size(); ++i) {
    same_ab += (*a)[i].rejected == (*b)[i].rejected;
    same_ac += (*a)[i].rejected == (*c)[i].rejected;
  }
  CHECK(same_ab == 50);
  CHECK(same_ac < 25);
}

TEST_CASE("task pairs: non-integer answers and bad options are INVALID_ARGUMENT") {
  std::vector<Example> ex = {{"train/0", "1+1=", "two"}};
  auto p = MakeTaskPreferencePairs(ex, {});
  REQUIRE(p.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(p.status().message().find("train/0") != std::string::npos);
  TaskPairOptions o;
  o.max_offset = 0;
  CHECK(MakeTaskPreferencePairs(Arith(5), o).status().message().find("max_offset") != std::string::npos);
}

TEST_CASE("pairs JSONL: round trip and errors naming line and field") {
  testing::TempDir dir;
  std::vector<PreferencePair> pairs = {{"1+2=", "3", "4"}, {"q \"x\"", "yes", "no"}};
  const std::string path = dir.path() + "/pairs.jsonl";
  {
    std::ofstream f(path);
    f << PreferencePairsToJsonl(pairs) << "\n";
  }
  auto back = ReadPreferencePairs(path);
  REQUIRE(back.ok());
  REQUIRE(back->size() == 2);
  CHECK((*back)[1].prompt == "q \"x\"");
  CHECK((*back)[0].rejected == "4");

  {
    std::ofstream f(path);
    f << "{\"prompt\": \"a\", \"chosen\": 5, \"rejected\": 6}\n{\"prompt\": \"a\", \"chosen\": \"b\"}\n";
  }
  auto bad = ReadPreferencePairs(path);
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find(":2:") != std::string::npos);
  CHECK(bad.status().message().find("rejected") != std::string::npos);
  CHECK(ReadPreferencePairs(dir.path() + "/missing.jsonl").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("pairs JSONL as token ids (the replay buffer's DPO export): read as is, bad ids named") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/dpo.jsonl";
  {
    std::ofstream f(path);
    // Extra export fields (rewards, ids of the trajectories) are ignored.
    f << "{\"prompt_id\": \"p0\", \"prompt_token_ids\": [1, 20, 21], \"chosen_token_ids\": [30, 2], "
         "\"rejected_token_ids\": [31, 32, 2], \"chosen_reward\": 1.0, \"rejected_reward\": 0.0}\n";
  }
  auto pairs = ReadPreferencePairs(path);
  REQUIRE(pairs.ok());
  REQUIRE(pairs->size() == 1);
  const PreferencePair& p = (*pairs)[0];
  CHECK(p.has_ids());
  CHECK(p.prompt_ids == std::vector<int>{1, 20, 21});
  CHECK(p.chosen_ids == std::vector<int>{30, 2});
  CHECK(p.rejected_ids == std::vector<int>{31, 32, 2});
  // Round trip through the writer.
  {
    std::ofstream f(path);
    f << PreferencePairsToJsonl(*pairs);
  }
  auto again = ReadPreferencePairs(path);
  REQUIRE(again.ok());
  CHECK((*again)[0].rejected_ids == p.rejected_ids);
  {
    std::ofstream f(path);
    f << "{\"prompt_token_ids\": [1], \"chosen_token_ids\": [3, -4], \"rejected_token_ids\": [5]}\n";
  }
  auto bad = ReadPreferencePairs(path);
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find(":1:") != std::string::npos);
  CHECK(bad.status().message().find("chosen_token_ids") != std::string::npos);
}

}  // namespace
}  // namespace rlmesh
