#include "tasks/task.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"

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
      task->train_.push_back(make(p, absl::StrCat("train/", task->train_.size())));
    }
    return std::unique_ptr<Task>(std::move(task));
  }
  std::string default_verifier() const override { return "numeric_answer"; }
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

}  // namespace

absl::StatusOr<std::unique_ptr<Task>> MakeTask(const TaskConfig& config, uint64_t seed) {
  const std::string kind = config.kind().empty() ? "arithmetic" : config.kind();
  if (kind == "arithmetic") return ArithmeticTask::Make(config, seed);
  if (kind == "jsonl") return JsonlTask::Make(config);
  return absl::InvalidArgumentError(absl::StrCat("task.kind: unknown task '", kind, "' (arithmetic, jsonl)"));
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

}  // namespace rlmesh
