#include "tasks/task.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "tasks/chat_data.h"
#include "tasks/chat_prompts.h"
#include "tasks/text_corpus.h"

namespace rlmesh {
namespace {

std::string ApplyTemplate(const std::string& templ, const std::string& prompt) {
  if (templ.empty()) return prompt;
  return absl::StrReplaceAll(templ, {{"{prompt}", prompt}});
}

int64_t Pow10(int d) {
  int64_t p = 1;
  for (int i = 0; i < d; ++i) p *= 10;
  return p;
}

// "a op b =" with operands of up to `digits` digits.
class ArithmeticTask final : public Task {
 public:
  static absl::StatusOr<std::unique_ptr<Task>> Make(const TaskConfig& c, uint64_t seed) {
    const int digits = c.digits() > 0 ? c.digits() : 2;
    if (digits > 9) return absl::InvalidArgumentError("task.digits: must be in [1, 9]");
    const std::string ops = c.ops().empty() ? "+" : c.ops();
    for (char op : ops) {
      if (op != '+' && op != '-' && op != '*') {
        return absl::InvalidArgumentError(absl::StrCat("task.ops: '", std::string(1, op), "' is not one of + - *"));
      }
    }
    const int64_t n_train = c.train() > 0 ? c.train() : 20000;
    const int64_t n_eval = c.eval() > 0 ? c.eval() : 500;
    const int64_t space = Pow10(digits) * Pow10(digits) * static_cast<int64_t>(ops.size());
    if (n_eval >= space) {
      return absl::InvalidArgumentError(absl::StrCat("task.eval: ", n_eval, " >= the ", space, " distinct problems"));
    }
    auto task = std::unique_ptr<ArithmeticTask>(new ArithmeticTask());
    std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
    std::uniform_int_distribution<int64_t> operand(0, Pow10(digits) - 1);
    std::uniform_int_distribution<size_t> pick_op(0, ops.size() - 1);
    auto draw = [&]() {
      return std::make_tuple(operand(rng), operand(rng), ops[pick_op(rng)]);
    };
    auto make = [&](const std::tuple<int64_t, int64_t, char>& p, const std::string& id) {
      auto [a, b, op] = p;
      int64_t r = op == '+' ? a + b : op == '-' ? a - b : a * b;
      Example e;
      e.id = id;
      e.prompt = ApplyTemplate(c.prompt_template(), absl::StrCat(a, std::string(1, op), b, "="));
      e.answer = absl::StrCat(r);
      return e;
    };
    if (!(c.sft_carry_errors() >= 0 && c.sft_carry_errors() <= 1)) {
      return absl::InvalidArgumentError("task.sft_carry_errors: must be in [0, 1]");
    }
    if (c.sft_carry_errors() > 0 && ops != "+") {
      return absl::InvalidArgumentError("task.sft_carry_errors: only for ops \"+\"");
    }
    if (!(c.sft_tool_calls() >= 0 && c.sft_tool_calls() <= 1)) {
      return absl::InvalidArgumentError("task.sft_tool_calls: must be in [0, 1]");
    }
    if (c.sft_tool_calls() > 0 && c.sft_carry_errors() > 0) {
      return absl::InvalidArgumentError("task.sft_tool_calls: not with sft_carry_errors (choose one kind of SFT data)");
    }

    // Whether train example i gets a carry-dropped SFT target: drawn per
    // example from the seed, so the policy sees the right and the wrong
    // habit on the same kinds of problems and cannot learn which is which.
    auto uniform = [&](size_t i, uint64_t salt) {
      uint64_t z = (seed ^ salt) + 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(i) + 1);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      z ^= z >> 31;
      return static_cast<double>(z >> 11) * 0x1.0p-53;
    };
    auto corrupted = [&](size_t i) { return uniform(i, 0xc0ffee) < c.sft_carry_errors(); };
    // Whether train example i is written as a calculator call (the same kind
    // of draw, another salt).
    auto tool_call = [&](size_t i) { return uniform(i, 0xca1c) < c.sft_tool_calls(); };
    // The digit-wise sum without carries (operands are >= 0 for '+').
    auto without_carries = [](int64_t a, int64_t b) {
      int64_t out = 0, place = 1;
      while (a > 0 || b > 0) {
        out += ((a % 10 + b % 10) % 10) * place;
        a /= 10;
        b /= 10;
        place *= 10;
      }
      return out;
    };
    std::set<std::tuple<int64_t, int64_t, char>> held_out;
    while (static_cast<int64_t>(held_out.size()) < n_eval) {
      auto p = draw();
      if (held_out.insert(p).second) task->eval_.push_back(make(p, absl::StrCat("eval/", held_out.size() - 1)));
    }
    // Train never contains a held-out problem; it may repeat problems when
    // the space is small (sampling with replacement).
    while (static_cast<int64_t>(task->train_.size()) < n_train) {
      auto p = draw();
      if (held_out.count(p)) continue;
      Example e = make(p, absl::StrCat("train/", task->train_.size()));
      const auto [a, b, op] = p;
      if (c.sft_carry_errors() > 0 && corrupted(task->train_.size())) {
        e.sft_target = absl::StrCat(without_carries(a, b));
      }
      if (c.sft_tool_calls() > 0 && tool_call(task->train_.size())) {
        // The multi-turn layout: the model's call, the calculator's
        // observation, the model's final answer.
        e.sft_target = absl::StrCat("<calc>", a, std::string(1, op), b, "</calc><result>", e.answer, "</result>",
                                    e.answer);
      }
      task->train_.push_back(std::move(e));
    }
    return std::unique_ptr<Task>(std::move(task));
  }
  std::string default_verifier() const override { return "numeric_answer"; }
};

// TinyZero's countdown: "3 7 5>26=" asks for an expression that uses each
// number exactly once and equals the target; the reference answer is one
// ("3*7+5"). Problems are built forwards from a random expression, so every
// one has a solution.
class CountdownTask final : public Task {
 public:
  static absl::StatusOr<std::unique_ptr<Task>> Make(const TaskConfig& c, uint64_t seed) {
    const int n = c.numbers() != 0 ? c.numbers() : 3;
    if (n < 2 || n > 6) return absl::InvalidArgumentError("task.numbers: must be in [2, 6]");
    const int64_t lo = c.min_number() != 0 ? c.min_number() : 1;
    const int64_t hi = c.max_number() != 0 ? c.max_number() : 20;
    if (lo < 1) return absl::InvalidArgumentError("task.min_number: must be >= 1");
    if (hi < lo || hi > 9999) {
      return absl::InvalidArgumentError(absl::StrCat("task.max_number: must be in [min_number=", lo, ", 9999]"));
    }
    const int64_t max_target = c.max_target() != 0 ? c.max_target() : 999;
    if (max_target < 1 || max_target > 1'000'000'000) {
      return absl::InvalidArgumentError("task.max_target: must be in [1, 1e9]");
    }
    const std::string ops = c.ops().empty() ? "+-*/" : c.ops();
    for (char op : ops) {
      if (op != '+' && op != '-' && op != '*' && op != '/') {
        return absl::InvalidArgumentError(
            absl::StrCat("task.ops: '", std::string(1, op), "' is not one of + - * /"));
      }
    }
    const int64_t n_train = c.train() > 0 ? c.train() : 20000;
    const int64_t n_eval = c.eval() > 0 ? c.eval() : 500;
    // Distinct problems are (multiset of numbers, target); an upper bound
    // catches impossible requests early, a draw budget the rest.
    double bound = static_cast<double>(max_target + 1);
    for (int k = 0; k < n; ++k) bound *= static_cast<double>(hi - lo + 1 + k) / (k + 1);
    if (static_cast<double>(n_eval) >= bound) {
      return absl::InvalidArgumentError(
          absl::StrCat("task.eval: ", n_eval, " >= the at most ", bound, " distinct problems"));
    }

    auto task = std::unique_ptr<CountdownTask>(new CountdownTask());
    std::mt19937_64 rng(seed ^ 0x5bd1e9955bd1e995ULL);
    // Own draws rather than std distributions: their use of the engine is
    // implementation-defined, and the data must not change with the library.
    auto uniform = [&](int64_t a, int64_t b) { return a + static_cast<int64_t>(rng() % static_cast<uint64_t>(b - a + 1)); };
    auto make = [&](const Problem& p, const std::string& id) {
      Example e;
      e.id = id;
      std::string text;
      for (int64_t v : p.numbers) absl::StrAppend(&text, text.empty() ? "" : " ", v);
      e.prompt = ApplyTemplate(c.prompt_template(), absl::StrCat(text, ">", p.target, "="));
      e.answer = p.solution;
      return e;
    };
    const int64_t budget = 100 * (n_train + n_eval) + 100'000;
    int64_t draws = 0;
    std::set<std::pair<std::vector<int64_t>, int64_t>> held_out;
    while (static_cast<int64_t>(held_out.size()) < n_eval) {
      if (++draws > budget) {
        return absl::InvalidArgumentError(absl::StrCat("task.eval: found only ", held_out.size(), " distinct problems in ",
                                                       budget, " draws; widen the ranges or ask for fewer"));
      }
      auto p = Draw(n, lo, hi, max_target, ops, uniform);
      if (p && held_out.insert(p->Key()).second) {
        task->eval_.push_back(make(*p, absl::StrCat("eval/", held_out.size() - 1)));
      }
    }
    // As in arithmetic: train never holds a held-out problem (in any order of
    // its numbers) and may repeat problems when the space is small.
    draws = 0;
    while (static_cast<int64_t>(task->train_.size()) < n_train) {
      if (++draws > budget) {
        return absl::InvalidArgumentError(absl::StrCat("task.train: found only ", task->train_.size(),
                                                       " problems outside the held-out split in ", budget, " draws"));
      }
      auto p = Draw(n, lo, hi, max_target, ops, uniform);
      if (!p || held_out.count(p->Key())) continue;
      task->train_.push_back(make(*p, absl::StrCat("train/", task->train_.size())));
    }
    return std::unique_ptr<Task>(std::move(task));
  }
  std::string default_verifier() const override { return "countdown"; }

 private:
  struct Problem {
    // In draw order, as the prompt lists them.
    std::vector<int64_t> numbers;
    int64_t target = 0;
    std::string solution;
    std::pair<std::vector<int64_t>, int64_t> Key() const {
      std::vector<int64_t> sorted = numbers;
      std::sort(sorted.begin(), sorted.end());
      return {sorted, target};
    }
  };
  // A subexpression: its value, text, and the precedence of its top
  // operator (1: + -, 2: * /, 3: a number).
  struct Node {
    int64_t value;
    std::string text;
    int prec;
  };

  // Combines two random nodes with a random operator until one is left; a
  // combination must stay an integer in [0, max_target]. Empty when a step
  // finds no valid combination (the caller draws again).
  template <typename Uniform>
  static std::optional<Problem> Draw(int n, int64_t lo, int64_t hi, int64_t max_target, const std::string& ops,
                                     Uniform& uniform) {
    Problem p;
    std::vector<Node> pool;
    for (int k = 0; k < n; ++k) {
      p.numbers.push_back(uniform(lo, hi));
      pool.push_back({p.numbers.back(), absl::StrCat(p.numbers.back()), 3});
    }
    while (pool.size() > 1) {
      bool combined = false;
      for (int attempt = 0; attempt < 16 && !combined; ++attempt) {
        const size_t i = static_cast<size_t>(uniform(0, static_cast<int64_t>(pool.size()) - 1));
        size_t j = static_cast<size_t>(uniform(0, static_cast<int64_t>(pool.size()) - 2));
        if (j >= i) ++j;
        const char op = ops[static_cast<size_t>(uniform(0, static_cast<int64_t>(ops.size()) - 1))];
        const Node& a = pool[i];
        const Node& b = pool[j];
        int64_t v;
        if (op == '+') {
          v = a.value + b.value;
        } else if (op == '-') {
          v = a.value - b.value;
        } else if (op == '*') {
          v = a.value * b.value;  // both <= max_target <= 1e9: no overflow
        } else {
          if (b.value == 0 || a.value % b.value != 0) continue;
          v = a.value / b.value;
        }
        if (v < 0 || v > max_target) continue;
        const int prec = op == '+' || op == '-' ? 1 : 2;
        // Minimal parentheses: a lower-precedence operand, or an equal one on
        // the right of - or / (a-(b+c), a/(b*c)).
        auto wrap = [&](const Node& x, bool right) {
          const bool paren = x.prec < prec || (right && x.prec == prec && (op == '-' || op == '/'));
          return paren ? absl::StrCat("(", x.text, ")") : x.text;
        };
        Node merged{v, absl::StrCat(wrap(a, false), std::string(1, op), wrap(b, true)), prec};
        pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(std::max(i, j)));
        pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(std::min(i, j)));
        pool.push_back(std::move(merged));
        combined = true;
      }
      if (!combined) return std::nullopt;
    }
    p.target = pool[0].value;
    p.solution = pool[0].text;
    return p;
  }
};

class JsonlTask final : public Task {
 public:
  static absl::StatusOr<std::unique_ptr<Task>> Make(const TaskConfig& c) {
    if (c.train_path().empty()) return absl::InvalidArgumentError("task.train_path: required for kind jsonl");
    if (c.eval_path().empty()) return absl::InvalidArgumentError("task.eval_path: required for kind jsonl");
    const std::string pf = c.prompt_field().empty() ? "prompt" : c.prompt_field();
    const std::string af = c.answer_field().empty() ? "answer" : c.answer_field();
    auto task = std::unique_ptr<JsonlTask>(new JsonlTask());
    auto train = ReadJsonlExamples(c.train_path(), pf, af, "train");
    if (!train.ok()) return train.status();
    auto eval = ReadJsonlExamples(c.eval_path(), pf, af, "eval");
    if (!eval.ok()) return eval.status();
    for (auto& e : *train) e.prompt = ApplyTemplate(c.prompt_template(), e.prompt);
    for (auto& e : *eval) e.prompt = ApplyTemplate(c.prompt_template(), e.prompt);
    task->train_ = std::move(*train);
    task->eval_ = std::move(*eval);
    return std::unique_ptr<Task>(std::move(task));
  }
  std::string default_verifier() const override { return "numeric_answer"; }
};

// Conversations in the chat `messages` format: the RL prompt is the
// conversation up to its last user turn, the reference answer a field of the
// line (else the first assistant turn after that user turn), and SFT trains
// on the assistant turns of the whole conversation (tasks/chat_data.h).
class ChatTask final : public Task {
 public:
  static absl::StatusOr<std::unique_ptr<Task>> Make(const TaskConfig& c, const std::string& tokenizer_spec) {
    if (c.train_path().empty()) return absl::InvalidArgumentError("task.train_path: required for kind chat");
    if (c.chat_template().empty()) {
      return absl::InvalidArgumentError(
          "task.chat_template: required for kind chat (\"model\" for the model's own, or a Jinja file)");
    }
    auto renderer = ChatRenderer::FromTask(c, tokenizer_spec);
    if (!renderer.ok()) return renderer.status();
    auto task = std::unique_ptr<ChatTask>(new ChatTask());
    auto train = Read(c, *renderer, c.train_path(), "train");
    if (!train.ok()) return train.status();
    task->train_ = *std::move(train);
    if (!c.eval_path().empty()) {
      auto eval = Read(c, *renderer, c.eval_path(), "eval");
      if (!eval.ok()) return eval.status();
      task->eval_ = *std::move(eval);
    }
    return std::unique_ptr<Task>(std::move(task));
  }
  std::string default_verifier() const override { return "numeric_answer"; }

 private:
  static absl::StatusOr<std::vector<Example>> Read(const TaskConfig& c, const ChatRenderer& renderer,
                                                   const std::string& path, const std::string& split) {
    const std::string mf = c.messages_field().empty() ? "messages" : c.messages_field();
    const std::string af = c.answer_field().empty() ? "answer" : c.answer_field();
    auto records = ReadChatJsonl(path, mf);
    if (!records.ok()) return records.status();
    std::vector<Example> out;
    for (ChatRecord& r : *records) {
      auto fail = [&](const absl::Status& s) {
        return absl::Status(s.code(), absl::StrCat(r.where, ": ", s.message()));
      };
      nlohmann::ordered_json messages = r.messages;
      if (!c.system_prompt().empty() && messages[0].value("role", "") != "system") {
        messages.insert(messages.begin(), nlohmann::ordered_json{{"role", "system"}, {"content", c.system_prompt()}});
      }
      Example e;
      e.source = r.where;
      auto id = r.record.find("id");
      e.id = id != r.record.end() && id->is_string() ? id->get<std::string>() : absl::StrCat(split, "/", out.size());
      auto prompt = RenderChatPrompt(renderer, messages, r.tools);
      if (!prompt.ok()) return fail(prompt.status());
      e.prompt = *std::move(prompt);
      auto answer = r.record.find(af);
      if (answer != r.record.end() && answer->is_string()) {
        e.answer = answer->get<std::string>();
      } else if (answer != r.record.end() && answer->is_number()) {
        e.answer = answer->dump();
      } else if (answer != r.record.end()) {
        return absl::InvalidArgumentError(absl::StrCat(r.where, ": field '", af, "' is not a string or number"));
      } else {
        // The first assistant turn after the last user turn.
        size_t last_user = 0;
        for (size_t i = 0; i < messages.size(); ++i) {
          if (messages[i].value("role", "") == "user") last_user = i;
        }
        bool found = false;
        for (size_t i = last_user + 1; i < messages.size() && !found; ++i) {
          if (messages[i].value("role", "") == "assistant" && messages[i].contains("content") &&
              messages[i]["content"].is_string()) {
            e.answer = messages[i]["content"].get<std::string>();
            found = true;
          }
        }
        if (!found) {
          return absl::InvalidArgumentError(absl::StrCat(
              r.where, ": no reference answer: no field '", af, "' and no assistant turn after the last user turn"));
        }
      }
      auto rendered = RenderWithAssistantSpans(renderer, messages, r.tools);
      if (!rendered.ok()) return fail(rendered.status());
      e.sft_text = std::move(rendered->text);
      for (const ByteSpan& sp : rendered->assistant) e.sft_spans.emplace_back(sp.begin, sp.end);
      out.push_back(std::move(e));
    }
    return out;
  }
};

// A corpus for continued pre-training: documents, no prompts
// (tasks/text_corpus.h). Only SFT stages train on it.
class TextTask final : public Task {
 public:
  static absl::StatusOr<std::unique_ptr<Task>> Make(const TaskConfig& c) {
    if (c.train_path().empty()) return absl::InvalidArgumentError("task.train_path: required for kind text");
    auto docs = ReadTextCorpus(c.train_path(), c.text_field().empty() ? "text" : c.text_field());
    if (!docs.ok()) return absl::Status(docs.status().code(), absl::StrCat("task.train_path: ", docs.status().message()));
    auto task = std::unique_ptr<TextTask>(new TextTask());
    for (Document& d : *docs) {
      Example e;
      e.id = d.source;
      e.source = d.source;
      e.sft_spans.emplace_back(0, static_cast<int64_t>(d.text.size()));
      e.sft_text = std::move(d.text);
      task->train_.push_back(std::move(e));
    }
    return std::unique_ptr<Task>(std::move(task));
  }
  std::string default_verifier() const override { return "numeric_answer"; }
};

}  // namespace

absl::Status Task::RenderPrompts(const TaskConfig& config, const std::string& tokenizer_spec) {
  return ApplyChatTemplateToExamples(config, tokenizer_spec, &train_, &eval_);
}

absl::StatusOr<std::unique_ptr<Task>> MakeTask(const TaskConfig& config, uint64_t seed,
                                              const std::string& tokenizer_spec) {
  const std::string kind = config.kind().empty() ? "arithmetic" : config.kind();
  absl::StatusOr<std::unique_ptr<Task>> task;
  if (kind == "arithmetic") {
    task = ArithmeticTask::Make(config, seed);
  } else if (kind == "countdown") {
    task = CountdownTask::Make(config, seed);
  } else if (kind == "jsonl") {
    task = JsonlTask::Make(config);
  } else if (kind == "chat") {
    // Renders its conversations itself.
    return ChatTask::Make(config, tokenizer_spec);
  } else if (kind == "text") {
    if (!config.chat_template().empty()) {
      return absl::InvalidArgumentError("task.chat_template: not used by kind text (documents are trained on as they are)");
    }
    return TextTask::Make(config);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("task.kind: unknown task '", kind, "' (arithmetic, countdown, jsonl, chat, text)"));
  }
  if (!task.ok()) return task;
  if (auto s = (*task)->RenderPrompts(config, tokenizer_spec); !s.ok()) return s;
  return task;
}

absl::StatusOr<std::vector<Example>> ReadJsonlExamples(const std::string& path,
                                                       const std::string& prompt_field,
                                                       const std::string& answer_field,
                                                       const std::string& split) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read dataset ", path));
  std::vector<Example> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": not a JSON object"));
    }
    auto field = [&](const std::string& name) -> absl::StatusOr<std::string> {
      auto it = j.find(name);
      if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": missing field '", name, "'"));
      if (it->is_string()) return it->get<std::string>();
      if (it->is_number()) return it->dump();
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": field '", name, "' is not a string or number"));
    };
    Example e;
    auto p = field(prompt_field);
    if (!p.ok()) return p.status();
    auto a = field(answer_field);
    if (!a.ok()) return a.status();
    e.prompt = *p;
    e.answer = *a;
    auto id = j.find("id");
    e.id = id != j.end() && id->is_string() ? id->get<std::string>() : absl::StrCat(split, "/", out.size());
    out.push_back(std::move(e));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  return out;
}

PromptLoader::PromptLoader(const std::vector<Example>* examples, uint64_t seed, Cursor cursor)
    : examples_(examples), seed_(seed), cursor_(cursor) {}

void PromptLoader::Shuffle() {
  order_.resize(examples_->size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int64_t>(i);
  std::mt19937_64 rng(seed_ * 1000003ULL + static_cast<uint64_t>(cursor_.epoch));
  // Fisher-Yates with our own index draws: std::shuffle's use of the engine
  // is implementation-defined, and resumed runs must see the same order.
  for (size_t i = order_.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng() % i);
    std::swap(order_[i - 1], order_[j]);
  }
  order_epoch_ = cursor_.epoch;
}

std::vector<const Example*> PromptLoader::Next(int n) {
  std::vector<const Example*> out;
  if (examples_->empty()) return out;
  for (int k = 0; k < n; ++k) {
    if (cursor_.index >= static_cast<int64_t>(examples_->size())) {
      ++cursor_.epoch;
      cursor_.index = 0;
    }
    if (order_epoch_ != cursor_.epoch) Shuffle();
    out.push_back(&(*examples_)[order_[cursor_.index++]]);
  }
  return out;
}

std::vector<const Example*> PromptLoader::NextBatch(int n) {
  const int64_t size = static_cast<int64_t>(examples_->size());
  if (n > size) n = static_cast<int>(size);
  if (cursor_.index > 0 && cursor_.index + n > size) {
    ++cursor_.epoch;
    cursor_.index = 0;
  }
  return Next(n);
}

}  // namespace rlmesh
