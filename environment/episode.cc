#include "environment/episode.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "environment/expression.h"

namespace rlmesh::environment {
namespace {

constexpr char kCallOpen[] = "<calc>";
constexpr char kCallClose[] = "</calc>";

class CalculatorEpisode final : public Episode {
 public:
  CalculatorEpisode(EnvironmentTask task, const EnvironmentOptions& options)
      : task_(std::move(task)), options_(options) {}

  std::string FirstObservation() override { return ""; }

  absl::StatusOr<StepResponse> Step(const StepRequest& request) override {
    StepResponse resp;
    const std::string& text = request.action_text();
    // The tool call is the last <calc>...</calc> of the turn.
    const size_t close = text.rfind(kCallClose);
    const size_t open = close == std::string::npos ? std::string::npos : text.rfind(kCallOpen, close);
    if (open == std::string::npos) {
      resp.set_done(true);
      double answer = 0, reference = 0;
      const bool has_answer = LastNumber(text, &answer);
      const bool has_reference = absl::SimpleAtod(task_.reference_answer(), &reference);
      const bool right = has_answer && has_reference && std::fabs(answer - reference) <= 1e-6;
      resp.set_reward(right ? 1.0 : 0.0);
      (*resp.mutable_info())["answer"] = has_answer ? FormatNumber(answer) : "";
      return resp;
    }
    const size_t start = open + sizeof(kCallOpen) - 1;
    const std::string expr = text.substr(start, close - start);
    (*resp.mutable_info())["tool"] = "calc";
    (*resp.mutable_info())["expression"] = expr;
    auto run = RunSandboxed({options_.evaluator_path}, expr, options_.sandbox);
    if (!run.ok()) return run.status();
    std::string value(absl::StripAsciiWhitespace(run->stdout_text));
    if (run->ok()) {
      resp.set_observation(absl::StrCat("<result>", value, "</result>"));
    } else {
      // The model's expression failed or hit a limit: an observation, so the
      // model can learn from it, never an RPC error.
      const std::string why = run->exit_code == 1 && !value.empty() ? value : run->Describe();
      resp.set_observation(absl::StrCat("<error>", why, "</error>"));
      (*resp.mutable_info())["error"] = why;
    }
    return resp;
  }

 private:
  const EnvironmentTask task_;
  const EnvironmentOptions& options_;
};

// FNV-1a: a hash that is the same on every build (std::hash need not be).
uint64_t Fnv(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

class ArithmeticEpisode final : public Episode {
 public:
  ArithmeticEpisode(int steps, int digits, uint64_t seed) : steps_(steps) {
    int64_t limit = 1;
    for (int i = 0; i < digits; ++i) limit *= 10;
    uint64_t s = seed;
    for (int i = 0; i < steps; ++i) {
      s = Mix(s);
      const int64_t a = static_cast<int64_t>(s % static_cast<uint64_t>(limit));
      s = Mix(s);
      const int64_t b = static_cast<int64_t>(s % static_cast<uint64_t>(limit));
      problems_.emplace_back(a, b);
    }
  }

  std::string FirstObservation() override { return Question(0); }

  absl::StatusOr<StepResponse> Step(const StepRequest& request) override {
    StepResponse resp;
    if (next_ >= steps_) {
      resp.set_done(true);
      return resp;
    }
    const int64_t want = problems_[next_].first + problems_[next_].second;
    double got = 0;
    const bool has = LastNumber(request.action_text(), &got);
    const bool right = has && got == static_cast<double>(want);
    resp.set_reward(right ? 1.0 / steps_ : 0.0);
    (*resp.mutable_info())["expected"] = absl::StrCat(want);
    ++next_;
    if (next_ == steps_) {
      resp.set_done(true);
      resp.set_observation(right ? " correct" : absl::StrCat(" wrong (", want, ")"));
      return resp;
    }
    resp.set_observation(absl::StrCat(right ? " correct\n" : absl::StrCat(" wrong (", want, ")\n"), Question(next_)));
    return resp;
  }

 private:
  std::string Question(int i) const {
    return absl::StrCat("Q", i + 1, ": ", problems_[i].first, "+", problems_[i].second, "=");
  }
  const int steps_;
  std::vector<std::pair<int64_t, int64_t>> problems_;
  int next_ = 0;
};

absl::StatusOr<int> MetadataInt(const EnvironmentTask& task, const std::string& key, int def, int lo, int hi) {
  auto it = task.metadata().find(key);
  if (it == task.metadata().end()) return def;
  int v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("task.metadata[\"", key, "\"]: \"", it->second, "\" is not an integer in [", lo, ", ", hi, "]"));
  }
  return v;
}

}  // namespace

absl::Status EnvironmentOptions::Validate() const {
  if (evaluator_path.empty() || evaluator_path[0] != '/') {
    return absl::InvalidArgumentError("evaluator_path: must be an absolute path");
  }
  if (default_environment != "calculator" && default_environment != "arithmetic") {
    return absl::InvalidArgumentError(
        absl::StrCat("default_environment: \"", default_environment, "\" is not calculator or arithmetic"));
  }
  return sandbox.Validate();
}

absl::StatusOr<std::unique_ptr<Episode>> MakeEpisode(const EnvironmentTask& task, const EnvironmentOptions& options) {
  const std::string name = task.environment().empty() ? options.default_environment : task.environment();
  if (name == "calculator") return std::unique_ptr<Episode>(new CalculatorEpisode(task, options));
  if (name == "arithmetic") {
    auto steps = MetadataInt(task, "steps", 3, 1, 16);
    if (!steps.ok()) return steps.status();
    auto digits = MetadataInt(task, "digits", 2, 1, 6);
    if (!digits.ok()) return digits.status();
    const uint64_t seed = Mix(task.seed() ^ Fnv(task.trajectory_id() + "|" + task.prompt_id()));
    return std::unique_ptr<Episode>(new ArithmeticEpisode(*steps, *digits, seed));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("task.environment: unknown environment \"", name, "\" (known: calculator, arithmetic)"));
}

bool LastNumber(const std::string& text, double* value) {
  // Scan back to the last digit, then back over the number it ends.
  size_t end = text.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(text[end - 1]))) --end;
  if (end == 0) return false;
  size_t start = end;
  while (start > 0 && (std::isdigit(static_cast<unsigned char>(text[start - 1])) || text[start - 1] == '.')) --start;
  while (start < end && text[start] == '.') ++start;
  if (start > 0 && text[start - 1] == '-') --start;
  return absl::SimpleAtod(text.substr(start, end - start), value);
}

}  // namespace rlmesh::environment
