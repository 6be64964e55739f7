#include "tasks/task.h"

#include <fstream>
#include <set>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

TEST_CASE("arithmetic: answers are right and the splits are disjoint") {
  TaskConfig c;
  c.set_kind("arithmetic");
  c.set_digits(2);
  c.set_ops("+-");
  c.set_train(3000);
  c.set_eval(200);
  auto task = MakeTask(c, 7);
  REQUIRE(task.ok());
  REQUIRE((*task)->train().size() == 3000);
  REQUIRE((*task)->eval().size() == 200);
  std::set<std::string> eval_prompts;
  for (const auto& e : (*task)->eval()) eval_prompts.insert(e.prompt);
  CHECK(eval_prompts.size() == 200);
  for (const auto& e : (*task)->train()) CHECK(eval_prompts.count(e.prompt) == 0);
  for (const auto& e : (*task)->eval()) {
    // Recompute from the prompt text.
    const size_t op = e.prompt.find_first_of("+-", 1);
    const long a = std::stol(e.prompt.substr(0, op));
    const long b = std::stol(e.prompt.substr(op + 1, e.prompt.size() - op - 2));
    const long r = e.prompt[op] == '+' ? a + b : a - b;
    CHECK(e.answer == std::to_string(r));
    CHECK(e.prompt.back() == '=');
  }
  // Same seed, same data; another seed, other data.
  auto again = MakeTask(c, 7);
  CHECK((*again)->eval()[5].prompt == (*task)->eval()[5].prompt);
  auto other = MakeTask(c, 8);
  int same = 0;
  for (int i = 0; i < 50; ++i) same += (*other)->eval()[i].prompt == (*task)->eval()[i].prompt;
  CHECK(same < 5);
}

TEST_CASE("bad task configs name the field") {
  TaskConfig c;
  c.set_kind("poetry");
  CHECK(MakeTask(c, 1).status().message().find("task.kind") != absl::string_view::npos);
  c.set_kind("arithmetic");
  c.set_ops("/");
  CHECK(MakeTask(c, 1).status().message().find("task.ops") != absl::string_view::npos);
  c.set_ops("+");
  c.set_digits(1);
  c.set_eval(100);
  CHECK(MakeTask(c, 1).status().message().find("task.eval") != absl::string_view::npos);
}

TEST_CASE("the loader is seeded, covers each epoch once and resumes from its cursor") {
  std::vector<Example> ex(10);
  for (int i = 0; i < 10; ++i) ex[i].id = std::to_string(i);
  PromptLoader a(&ex, 3);
  std::vector<std::string> first;
  for (auto* e : a.Next(10)) first.push_back(e->id);
  CHECK(std::set<std::string>(first.begin(), first.end()).size() == 10);
  auto cursor = a.cursor();
  std::vector<std::string> rest;
  for (auto* e : a.Next(7)) rest.push_back(e->id);
  PromptLoader b(&ex, 3, cursor);
  std::vector<std::string> resumed;
  for (auto* e : b.Next(7)) resumed.push_back(e->id);
  CHECK(resumed == rest);
  CHECK(rest != std::vector<std::string>(first.begin(), first.begin() + 7));  // new permutation
}

TEST_CASE("JSONL datasets load and bad lines are named") {
  testing::TempDir dir;
  std::ofstream(dir.File("ok.jsonl")) << R"({"prompt": "Q: 2+2?", "answer": 4})" << "\n"
                                      << R"({"prompt": "Q: 3+4?", "answer": "7", "id": "q2"})" << "\n";
  auto ok = ReadJsonlExamples(dir.File("ok.jsonl"), "prompt", "answer", "train");
  REQUIRE(ok.ok());
  REQUIRE(ok->size() == 2);
  CHECK((*ok)[0].answer == "4");
  CHECK((*ok)[1].id == "q2");
  std::ofstream(dir.File("bad.jsonl")) << R"({"prompt": "x", "answer": 1})" << "\n{oops\n";
  auto bad = ReadJsonlExamples(dir.File("bad.jsonl"), "prompt", "answer", "train");
  CHECK(bad.status().message().find("bad.jsonl:2") != absl::string_view::npos);
  std::ofstream(dir.File("nofield.jsonl")) << R"({"question": "x", "answer": 1})" << "\n";
  auto nofield = ReadJsonlExamples(dir.File("nofield.jsonl"), "prompt", "answer", "train");
  CHECK(nofield.status().message().find("missing field 'prompt'") != absl::string_view::npos);
}

}  // namespace
}  // namespace rlmesh
