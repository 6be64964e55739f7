#include "tasks/task.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "reward_server/verifiers.h"

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

TEST_CASE("arithmetic: sft_tool_calls writes that share of SFT targets as a calculator call and its answer") {
  TaskConfig c;
  c.set_kind("arithmetic");
  c.set_digits(2);
  c.set_ops("*");
  c.set_train(2000);
  c.set_eval(100);
  c.set_sft_tool_calls(0.25);
  auto task = MakeTask(c, 5);
  REQUIRE(task.ok());
  int calls = 0;
  for (const auto& e : (*task)->train()) {
    const std::string expr = e.prompt.substr(0, e.prompt.size() - 1);  // "12*34=" -> "12*34"
    const size_t op = expr.find('*');
    CHECK(e.answer == std::to_string(std::stol(expr.substr(0, op)) * std::stol(expr.substr(op + 1))));
    if (e.sft_target.empty()) continue;
    CHECK(e.sft_target == "<calc>" + expr + "</calc><result>" + e.answer + "</result>" + e.answer);
    ++calls;
  }
  CHECK(std::abs(calls / 2000.0 - 0.25) < 0.03);
  for (const auto& e : (*task)->eval()) CHECK(e.sft_target.empty());
  auto again = MakeTask(c, 5);
  for (size_t i = 0; i < 200; ++i) CHECK((*again)->train()[i].sft_target == (*task)->train()[i].sft_target);
  c.set_sft_tool_calls(-0.1);
  CHECK(absl::StrContains(MakeTask(c, 1).status().message(), "task.sft_tool_calls"));
  c.set_sft_tool_calls(0.5);
  c.set_ops("+");
  c.set_sft_carry_errors(0.5);
  CHECK(absl::StrContains(MakeTask(c, 1).status().message(), "task.sft_tool_calls"));
}

TEST_CASE("arithmetic: sft_carry_errors drops the carries of that share of SFT targets, nothing else") {
  TaskConfig c;
  c.set_kind("arithmetic");
  c.set_digits(2);
  c.set_train(4000);
  c.set_eval(100);
  c.set_sft_carry_errors(0.5);
  auto task = MakeTask(c, 11);
  REQUIRE(task.ok());
  int carry = 0, dropped = 0;
  for (const auto& e : (*task)->train()) {
    const size_t op = e.prompt.find('+');
    const long a = std::stol(e.prompt.substr(0, op));
    const long b = std::stol(e.prompt.substr(op + 1, e.prompt.size() - op - 2));
    CHECK(e.answer == std::to_string(a + b));  // the reference is always right
    const long no_carry = (a % 10 + b % 10) % 10 + 10 * ((a / 10 + b / 10) % 10);
    if (no_carry == a + b) {
      // Nothing to drop: the SFT target is the answer.
      CHECK((e.sft_target.empty() || e.sft_target == e.answer));
      continue;
    }
    ++carry;
    if (!e.sft_target.empty()) {
      CHECK(e.sft_target == std::to_string(no_carry));
      ++dropped;
    }
  }
  INFO(dropped << " of " << carry << " problems with a carry");
  CHECK(carry > 1000);
  CHECK(std::abs(static_cast<double>(dropped) / carry - 0.5) < 0.05);
  for (const auto& e : (*task)->eval()) CHECK(e.sft_target.empty());
  // Same seed, same targets.
  auto again = MakeTask(c, 11);
  for (size_t i = 0; i < 200; ++i) CHECK((*again)->train()[i].sft_target == (*task)->train()[i].sft_target);
  // Refused by name: out of range, or with an operator that has no carries.
  c.set_sft_carry_errors(1.5);
  CHECK(absl::StrContains(MakeTask(c, 1).status().message(), "task.sft_carry_errors"));
  c.set_sft_carry_errors(0.5);
  c.set_ops("+-");
  CHECK(absl::StrContains(MakeTask(c, 1).status().message(), "task.sft_carry_errors"));
}

// "3 7 5>26=" -> ({3, 7, 5}, 26).
std::pair<std::vector<int64_t>, int64_t> ParseCountdownPrompt(const std::string& prompt) {
  std::vector<int64_t> numbers;
  const size_t gt = prompt.find('>');
  std::istringstream in(prompt.substr(0, gt));
  int64_t v;
  while (in >> v) numbers.push_back(v);
  return {numbers, std::stoll(prompt.substr(gt + 1))};
}

TEST_CASE("countdown: every problem is solved by its answer; seeded; disjoint splits") {
  TaskConfig c;
  c.set_kind("countdown");
  c.set_train(2000);
  c.set_eval(300);
  auto task = MakeTask(c, 11);
  REQUIRE(task.ok());
  CHECK((*task)->default_verifier() == "countdown");
  REQUIRE((*task)->train().size() == 2000);
  REQUIRE((*task)->eval().size() == 300);
  std::set<char> ops_seen;
  bool parens_seen = false;
  for (const auto* split : {&(*task)->train(), &(*task)->eval()}) {
    for (const auto& e : *split) {
      INFO(e.prompt << " " << e.answer);
      REQUIRE(e.prompt.back() == '=');
      auto [numbers, target] = ParseCountdownPrompt(e.prompt);
      REQUIRE(numbers.size() == 3);
      for (int64_t n : numbers) CHECK((n >= 1 && n <= 20));
      CHECK((target >= 0 && target <= 999));
      // The verifier's own parser re-evaluates the answer text: the value
      // must be the target and the literals exactly the prompt's numbers.
      auto solution = ParseCountdownExpression(e.answer);
      REQUIRE(solution.ok());
      CHECK(solution->denominator == 1);
      CHECK(solution->numerator == target);
      std::vector<int64_t> used = solution->numbers;
      std::sort(used.begin(), used.end());
      std::sort(numbers.begin(), numbers.end());
      CHECK(used == numbers);
      for (char ch : e.answer) {
        if (std::string("+-*/").find(ch) != std::string::npos) ops_seen.insert(ch);
        parens_seen |= ch == '(';
      }
      // Short enough for a char model with a 32-position window.
      CHECK(e.prompt.size() + e.answer.size() + 2 <= 32);
    }
  }
  CHECK(ops_seen.size() == 4);
  CHECK(parens_seen);

  // Held-out problems are distinct and never in train, whatever the order
  // of their numbers.
  auto key = [](const Example& e) {
    auto k = ParseCountdownPrompt(e.prompt);
    std::sort(k.first.begin(), k.first.end());
    return k;
  };
  std::set<std::pair<std::vector<int64_t>, int64_t>> held_out;
  for (const auto& e : (*task)->eval()) held_out.insert(key(e));
  CHECK(held_out.size() == 300);
  for (const auto& e : (*task)->train()) CHECK(held_out.count(key(e)) == 0);

  auto again = MakeTask(c, 11);
  for (int i : {0, 5, 299}) {
    CHECK((*again)->eval()[i].prompt == (*task)->eval()[i].prompt);
    CHECK((*again)->eval()[i].answer == (*task)->eval()[i].answer);
  }
  CHECK((*again)->train()[1999].prompt == (*task)->train()[1999].prompt);
  auto other = MakeTask(c, 12);
  int same = 0;
  for (int i = 0; i < 50; ++i) same += (*other)->eval()[i].prompt == (*task)->eval()[i].prompt;
  CHECK(same < 5);
}

TEST_CASE("countdown: numbers, ranges and operators follow the config") {
  TaskConfig c;
  c.set_kind("countdown");
  c.set_numbers(4);
  c.set_min_number(5);
  c.set_max_number(9);
  c.set_max_target(50);
  c.set_ops("+-");
  c.set_train(200);
  c.set_eval(50);
  c.set_prompt_template("Q{prompt}");
  auto task = MakeTask(c, 3);
  REQUIRE(task.ok());
  for (const auto& e : (*task)->train()) {
    INFO(e.prompt << " " << e.answer);
    REQUIRE(e.prompt.substr(0, 1) == "Q");
    auto [numbers, target] = ParseCountdownPrompt(e.prompt.substr(1));
    REQUIRE(numbers.size() == 4);
    for (int64_t n : numbers) CHECK((n >= 5 && n <= 9));
    CHECK(target <= 50);
    CHECK(e.answer.find_first_of("*/") == std::string::npos);
    auto solution = ParseCountdownExpression(e.answer);
    REQUIRE(solution.ok());
    CHECK(solution->numerator == target);
  }
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

  TaskConfig cd;
  cd.set_kind("countdown");
  cd.set_train(10);
  cd.set_eval(10);
  auto field_of = [&](const TaskConfig& bad) { return std::string(MakeTask(bad, 1).status().message()); };
  TaskConfig bad = cd;
  bad.set_numbers(1);
  CHECK(field_of(bad).find("task.numbers") != std::string::npos);
  bad = cd;
  bad.set_numbers(7);
  CHECK(field_of(bad).find("task.numbers") != std::string::npos);
  bad = cd;
  bad.set_min_number(-1);
  CHECK(field_of(bad).find("task.min_number") != std::string::npos);
  bad = cd;
  bad.set_min_number(10);
  bad.set_max_number(5);
  CHECK(field_of(bad).find("task.max_number") != std::string::npos);
  bad = cd;
  bad.set_max_target(-3);
  CHECK(field_of(bad).find("task.max_target") != std::string::npos);
  bad = cd;
  bad.set_ops("+%");
  CHECK(field_of(bad).find("task.ops") != std::string::npos);
  bad = cd;  // two numbers in [1, 2], targets in [0, 3]: at most 12 problems
  bad.set_numbers(2);
  bad.set_max_number(2);
  bad.set_max_target(3);
  bad.set_eval(12);
  CHECK(MakeTask(bad, 1).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(field_of(bad).find("task.eval") != std::string::npos);
  bad.set_eval(6);  // under the bound, but only 1+1, 1*1, 2-1, 2/1, 2+1, ... reach few targets
  bad.set_ops("-");
  CHECK(field_of(bad).find("task.eval") != std::string::npos);
  CHECK(MakeTask(cd, 1).ok());
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

TEST_CASE("chat_template: prompts become the model's chat turn; errors name the field") {
  testing::TempDir dir;
  const std::string folder = dir.File("tok");
  std::filesystem::create_directories(folder);
  // A ChatML template of our own, with a default system turn, as the
  // model's tokenizer_config.json carries it.
  const std::string tmpl =
      "{%- if messages[0].role != 'system' %}{{ '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}{%- endif %}"
      "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
      "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- if not think %}{{ '<think></think>' }}"
      "{%- endif %}{%- endif %}";
  {
    nlohmann::json cfg = {{"chat_template", tmpl}, {"eos_token", "<|im_end|>"}, {"bos_token", nullptr}};
    std::ofstream(folder + "/tokenizer_config.json") << cfg.dump();
    std::ofstream(folder + "/tokenizer.json") << "{}";
  }
  TaskConfig c;
  c.set_kind("arithmetic");
  c.set_train(20);
  c.set_eval(5);
  auto plain = MakeTask(c, 3);
  REQUIRE(plain.ok());
  c.set_chat_template("model");
  auto chat = MakeTask(c, 3, folder + "/tokenizer.json");
  REQUIRE(chat.ok());
  for (size_t i = 0; i < 5; ++i) {
    const std::string& p = (*plain)->eval()[i].prompt;
    CHECK((*chat)->eval()[i].prompt ==
          "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + p +
              "<|im_end|>\n<|im_start|>assistant\n<think></think>");
    CHECK((*chat)->eval()[i].answer == (*plain)->eval()[i].answer);
  }
  c.set_system_prompt("Add.");
  c.set_chat_template_kwargs(R"({"think": true})");
  auto sys = MakeTask(c, 3, folder);  // the folder itself is a spec too
  REQUIRE(sys.ok());
  CHECK((*sys)->train()[0].prompt == "<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n" +
                                          (*plain)->train()[0].prompt + "<|im_end|>\n<|im_start|>assistant\n");
  // A template file of the user's.
  std::ofstream(dir.File("t.jinja")) << "[{{ messages[-1].content }}]{% if add_generation_prompt %}>{% endif %}";
  TaskConfig f = c;
  f.set_chat_template(dir.File("t.jinja"));
  f.clear_system_prompt();
  auto file = MakeTask(f, 3);
  REQUIRE(file.ok());
  CHECK((*file)->eval()[0].prompt == "[" + (*plain)->eval()[0].prompt + "]>");

  auto refused = [&](TaskConfig bad, const std::string& spec, const std::string& part) {
    auto t = MakeTask(bad, 3, spec);
    REQUIRE_FALSE(t.ok());
    INFO(t.status().message());
    CHECK(absl::StrContains(t.status().message(), part));
  };
  refused(c, "char", "task.chat_template");
  TaskConfig kw = c;
  kw.set_chat_template_kwargs("[1]");
  refused(kw, folder, "task.chat_template_kwargs");
  TaskConfig missing = c;
  missing.set_chat_template(dir.File("nope.jinja"));
  refused(missing, folder, "nope.jinja");
  std::ofstream(dir.File("bad.jinja")) << "{% macro m() %}x{% endmacro %}";
  TaskConfig unsupported = c;
  unsupported.set_chat_template(dir.File("bad.jinja"));
  refused(unsupported, folder, "macro");
}

TEST_CASE("PromptLoader::NextBatch: a batch never repeats an example, even across an epoch boundary") {
  std::vector<Example> ex(10);
  for (int i = 0; i < 10; ++i) ex[i].id = "train/" + std::to_string(i);
  PromptLoader loader(&ex, 5);
  const std::vector<Example> five(ex.begin(), ex.begin() + 5);
  PromptLoader plain(&five, 5);
  std::set<int64_t> epochs;
  for (int step = 0; step < 12; ++step) {
    auto batch = loader.NextBatch(4);
    REQUIRE(batch.size() == 4);
    std::set<std::string> ids;
    for (const Example* e : batch) ids.insert(e->id);
    INFO("step " << step);
    CHECK(ids.size() == 4);
    epochs.insert(loader.cursor().epoch);
  }
  CHECK(epochs.size() > 3);
  // Next crosses epoch boundaries inside a batch and so repeats examples.
  int repeats = 0;
  for (int step = 0; step < 12; ++step) {
    std::set<std::string> ids;
    for (const Example* e : plain.Next(4)) ids.insert(e->id);
    repeats += ids.size() < 4;
  }
  CHECK(repeats > 0);
  // Replaying k batches from a fresh loader resumes the same stream.
  PromptLoader a(&ex, 9), b(&ex, 9);
  for (int i = 0; i < 5; ++i) a.NextBatch(3);
  for (int i = 0; i < 5; ++i) b.NextBatch(3);
  CHECK(a.NextBatch(3) == b.NextBatch(3));
  // More than the data: every example once.
  auto all = PromptLoader(&ex, 1).NextBatch(50);
  CHECK(std::set<const Example*>(all.begin(), all.end()).size() == 10);
}

}  // namespace
}  // namespace rlmesh
