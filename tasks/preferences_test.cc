#include "tasks/preferences.h"

#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "tasks/chat_prompts.h"

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

TEST_CASE("chat-format pairs: prompt messages rendered with the header, replies as the template writes them") {
  const std::string sample = testing::Runfile("configs/data/preference_chat_sample.jsonl");
  TaskConfig task;
  task.set_chat_template("model");
  auto renderer = ChatRenderer::FromTask(task, testing::Runfile("configs/data/chat_tokenizer"));
  REQUIRE(renderer.ok());
  auto pairs = ReadPreferencePairs(sample, &*renderer);
  INFO(pairs.status().ToString());
  REQUIRE(pairs.ok());
  REQUIRE(pairs->size() == 3);
  const PreferencePair& p = (*pairs)[0];
  CHECK(p.prompt ==
        "<|im_start|>system\nSolve the problem. End with #### and the number.<|im_end|>\n"
        "<|im_start|>user\nBen has 34 coins. A friend has twice as many. How many does the friend have?<|im_end|>\n"
        "<|im_start|>assistant\n");
  // "<|im_end|>\n" after the reply: the newline is whitespace, <|im_end|>
  // the eos EncodeResponse adds back.
  CHECK(p.chosen == "2*34=68 #### 68");
  CHECK(p.rejected == "2*34=58 #### 58");
  CHECK((*pairs)[1].prompt ==
        "<|im_start|>system\nAnswer with the number.<|im_end|>\n<|im_start|>user\nWhat is 12 plus 30?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK((*pairs)[1].chosen == "42");
  CHECK((*pairs)[1].rejected == "52");
  CHECK(absl::EndsWith((*pairs)[2].prompt, "And if she gives away 7?<|im_end|>\n<|im_start|>assistant\n"));
  CHECK((*pairs)[2].chosen == "47-7=40 #### 40");

  // Without a template, or with a bad message, the line is named.
  auto none = ReadPreferencePairs(sample);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() ==
        sample + ":1: prompt: a messages array needs a chat template (set task.chat_template)");
  testing::TempDir dir;
  std::ofstream(dir.File("p.jsonl")) << "{\"prompt\": [{\"role\": \"user\", \"content\": \"q\"}], \"chosen\": "
                                        "[{\"role\": \"helper\", \"content\": \"a\"}], \"rejected\": \"b\"}\n";
  auto bad = ReadPreferencePairs(dir.File("p.jsonl"), &*renderer);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() ==
        dir.File("p.jsonl") + ":1: chosen[0].role: \"helper\" is not system, user, assistant or tool");
}

}  // namespace
}  // namespace rlmesh
