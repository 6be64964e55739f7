#include "reward_server/verifiers.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/subprocess.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

std::string Trim(const std::string& s) { return std::string(absl::StripAsciiWhitespace(s)); }

// Numbers: optional sign, digits with optional thousands commas, optional
// fraction.
std::vector<double> NumbersIn(const std::string& text) {
  std::vector<double> found;
  size_t i = 0;
  while (i < text.size()) {
    const bool sign = text[i] == '-' && i + 1 < text.size() && absl::ascii_isdigit(text[i + 1]) &&
                      (i == 0 || !absl::ascii_isdigit(text[i - 1]));
    if (!sign && !absl::ascii_isdigit(text[i])) {
      ++i;
      continue;
    }
    size_t j = sign ? i + 1 : i;
    std::string digits = sign ? "-" : "";
    while (j < text.size() &&
           (absl::ascii_isdigit(text[j]) ||
            (text[j] == ',' && j + 1 < text.size() && absl::ascii_isdigit(text[j + 1]) && j > i))) {
      if (text[j] != ',') digits += text[j];
      ++j;
    }
    if (j + 1 < text.size() && text[j] == '.' && absl::ascii_isdigit(text[j + 1])) {
      digits += '.';
      ++j;
      while (j < text.size() && absl::ascii_isdigit(text[j])) digits += text[j++];
    }
    double v;
    if (absl::SimpleAtod(digits, &v)) found.push_back(v);
    i = j;
  }
  return found;
}

std::optional<double> LastNumberIn(const std::string& text) {
  auto all = NumbersIn(text);
  if (all.empty()) return std::nullopt;
  return all.back();
}

class ExactMatch final : public Verifier {
 public:
  explicit ExactMatch(std::string label) : label_(std::move(label)) {}
  const std::string& label() const override { return label_; }
  absl::StatusOr<double> Score(const VerifierInput& in, absl::Time) const override {
    return Trim(in.completion) == Trim(in.reference_answer) ? 1.0 : 0.0;
  }

 private:
  std::string label_;
};

class NumericAnswer final : public Verifier {
 public:
  NumericAnswer(std::string label, double tolerance) : label_(std::move(label)), tolerance_(tolerance) {}
  const std::string& label() const override { return label_; }
  absl::StatusOr<double> Score(const VerifierInput& in, absl::Time) const override {
    auto want = ExtractFinalNumber(in.reference_answer);
    if (!want) return absl::InvalidArgumentError("reference_answer: no number in it");
    auto got = ExtractFinalNumber(in.completion);
    return got && std::fabs(*got - *want) <= tolerance_ ? 1.0 : 0.0;
  }

 private:
  std::string label_;
  double tolerance_;
};

// Exact fractions over int64: every operation reports overflow instead of
// wrapping, so a long product scores 0 rather than a wrong value.
struct Fraction {
  int64_t num = 0;
  int64_t den = 1;
};

int64_t Gcd(int64_t a, int64_t b) {
  a = a < 0 ? -a : a;
  b = b < 0 ? -b : b;
  while (b != 0) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

absl::StatusOr<Fraction> Reduced(int64_t num, int64_t den) {
  if (den == 0) return absl::InvalidArgumentError("division by zero");
  if (num == INT64_MIN || den == INT64_MIN) return absl::InvalidArgumentError("value overflows");
  if (den < 0) {
    num = -num;
    den = -den;
  }
  const int64_t g = Gcd(num, den);
  return Fraction{num / g, den / g};
}

absl::StatusOr<Fraction> Apply(char op, Fraction a, Fraction b) {
  int64_t x, y, num, den;
  bool overflow = false;
  switch (op) {
    case '+':
    case '-':
      overflow |= __builtin_mul_overflow(a.num, b.den, &x);
      overflow |= __builtin_mul_overflow(b.num, a.den, &y);
      overflow |= op == '+' ? __builtin_add_overflow(x, y, &num) : __builtin_sub_overflow(x, y, &num);
      overflow |= __builtin_mul_overflow(a.den, b.den, &den);
      break;
    case '*':
      overflow |= __builtin_mul_overflow(a.num, b.num, &num);
      overflow |= __builtin_mul_overflow(a.den, b.den, &den);
      break;
    default:  // '/'
      if (b.num == 0) return absl::InvalidArgumentError("division by zero");
      overflow |= __builtin_mul_overflow(a.num, b.den, &num);
      overflow |= __builtin_mul_overflow(a.den, b.num, &den);
      break;
  }
  if (overflow) return absl::InvalidArgumentError("value overflows");
  return Reduced(num, den);
}

// Recursive descent over expr := term (('+'|'-') term)*,
// term := factor (('*'|'/') factor)*, factor := integer | '(' expr ')'.
// Input length is capped, which bounds the recursion depth.
class CountdownParser {
 public:
  explicit CountdownParser(const std::string& text) : text_(text) {}

  absl::StatusOr<CountdownExpression> Parse() {
    if (text_.empty()) return absl::InvalidArgumentError("empty expression");
    if (text_.size() > kMaxChars) return absl::InvalidArgumentError("expression too long");
    auto value = Expr();
    if (!value.ok()) return value.status();
    if (pos_ != text_.size()) return Error("unexpected character");
    out_.numerator = value->num;
    out_.denominator = value->den;
    return std::move(out_);
  }

 private:
  static constexpr size_t kMaxChars = 256;

  absl::Status Error(const char* what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at offset ", pos_));
  }
  bool At(char c) const { return pos_ < text_.size() && text_[pos_] == c; }

  absl::StatusOr<Fraction> Expr() {
    auto left = Term();
    while (left.ok() && (At('+') || At('-'))) {
      const char op = text_[pos_++];
      auto right = Term();
      if (!right.ok()) return right;
      left = Apply(op, *left, *right);
    }
    return left;
  }

  absl::StatusOr<Fraction> Term() {
    auto left = Factor();
    while (left.ok() && (At('*') || At('/'))) {
      const char op = text_[pos_++];
      auto right = Factor();
      if (!right.ok()) return right;
      left = Apply(op, *left, *right);
    }
    return left;
  }

  absl::StatusOr<Fraction> Factor() {
    if (At('(')) {
      ++pos_;
      auto inner = Expr();
      if (!inner.ok()) return inner;
      if (!At(')')) return Error("missing ')'");
      ++pos_;
      return inner;
    }
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < text_.size() && absl::ascii_isdigit(text_[pos_])) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, text_[pos_] - '0', &v)) {
        return Error("integer overflows");
      }
      ++pos_;
    }
    if (pos_ == start) return Error("expected a number or '('");
    out_.numbers.push_back(v);
    return Fraction{v, 1};
  }

  const std::string& text_;
  size_t pos_ = 0;
  CountdownExpression out_;
};

// The problem (numbers and target) comes from the reference answer, a
// solution expression: that keeps the verifier independent of the prompt's
// wording and template, and lets the same text be the SFT target.
class Countdown final : public Verifier {
 public:
  explicit Countdown(std::string label) : label_(std::move(label)) {}
  const std::string& label() const override { return label_; }
  absl::StatusOr<double> Score(const VerifierInput& in, absl::Time) const override {
    auto want = ParseCountdownExpression(Trim(in.reference_answer));
    if (!want.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("reference_answer: not a countdown solution expression: ", want.status().message()));
    }
    // The answer ends at the first whitespace (or a written-out <eos>).
    std::string text = in.completion.substr(0, in.completion.find("<eos>"));
    const size_t begin = text.find_first_not_of(" \t\r\n");
    if (begin == std::string::npos) return 0.0;
    const size_t end = text.find_first_of(" \t\r\n", begin);
    auto got = ParseCountdownExpression(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (!got.ok()) return 0.0;  // garbage, division by zero, overflow
    if (got->numerator != want->numerator || got->denominator != want->denominator) return 0.0;
    std::vector<int64_t> a = got->numbers, b = want->numbers;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    return a == b ? 1.0 : 0.0;
  }

 private:
  std::string label_;
};

class Format final : public Verifier {
 public:
  Format(std::string label, std::regex re) : label_(std::move(label)), re_(std::move(re)) {}
  const std::string& label() const override { return label_; }
  absl::StatusOr<double> Score(const VerifierInput& in, absl::Time) const override {
    return std::regex_search(in.completion, re_) ? 1.0 : 0.0;
  }
  // A user pattern can backtrack for a very long time.
  bool may_block() const override { return true; }

 private:
  std::string label_;
  std::regex re_;
};

class Length final : public Verifier {
 public:
  Length(std::string label, int max_tokens, double penalty)
      : label_(std::move(label)), max_tokens_(max_tokens), penalty_(penalty) {}
  const std::string& label() const override { return label_; }
  absl::StatusOr<double> Score(const VerifierInput& in, absl::Time) const override {
    const int over = in.completion_tokens - max_tokens_;
    return over > 0 ? -penalty_ * over : 0.0;
  }

 private:
  std::string label_;
  int max_tokens_;
  double penalty_;
};

// Runs an external program per completion with the JSON on its stdin; it
// and whatever it started (its process group) are SIGKILLed at the deadline.
class Command final : public Verifier {
 public:
  Command(std::string label, std::vector<std::string> argv) : label_(std::move(label)), argv_(std::move(argv)) {}
  const std::string& label() const override { return label_; }
  bool may_block() const override { return true; }

  absl::StatusOr<double> Score(const VerifierInput& in, absl::Time deadline) const override {
    nlohmann::json j = {{"prompt", in.prompt},
                        {"completion", in.completion},
                        {"reference_answer", in.reference_answer}};
    const std::string input = j.dump() + "\n";
    SubprocessOptions o;
    o.argv = argv_;
    o.stdin_stream = Stdio::Pipe();
    o.stdout_stream = Stdio::Pipe();
    // A number is expected; a MiB of anything else is plenty to show.
    absl::StatusOr<RunResult> run = Run(o, input, deadline, int64_t{1} << 20);
    // Not the request's fault whatever the reason (argv[0] gone, no fork).
    if (!run.ok()) return absl::InternalError(absl::StrCat(label_, ": ", run.status().message()));
    if (run->timed_out) {
      return absl::DeadlineExceededError(absl::StrCat(label_, ": killed at its deadline"));
    }
    if (!run->success()) {
      return absl::InternalError(
          absl::StrCat(label_, ": command failed (", DescribeWaitStatus(run->wait_status), ")"));
    }
    const std::string& out = run->stdout_text;
    double v;
    if (!absl::SimpleAtod(Trim(out), &v) || !std::isfinite(v)) {
      return absl::InternalError(absl::StrCat(label_, ": command printed '", Trim(out), "', not a number"));
    }
    return v;
  }

 private:
  std::string label_;
  std::vector<std::string> argv_;
};

}  // namespace

std::optional<double> ExtractFinalNumber(const std::string& text) {
  // GSM8K marks the final answer with "####": the number right after it.
  const size_t hashes = text.rfind("####");
  if (hashes != std::string::npos) {
    auto after = NumbersIn(text.substr(hashes + 4));
    if (!after.empty()) return after.front();
  }
  const size_t boxed = text.rfind("\\boxed{");
  if (boxed != std::string::npos) {
    const size_t end = text.find('}', boxed);
    if (auto v = LastNumberIn(text.substr(boxed + 7, end == std::string::npos ? std::string::npos : end - boxed - 7))) {
      return v;
    }
  }
  return LastNumberIn(text);
}

absl::StatusOr<CountdownExpression> ParseCountdownExpression(const std::string& text) {
  return CountdownParser(text).Parse();
}

absl::StatusOr<std::unique_ptr<Verifier>> MakeVerifier(const VerifierConfig& c, const std::string& path) {
  const std::string label = c.label().empty() ? c.name() : c.label();
  if (c.name() == "exact_match") return std::unique_ptr<Verifier>(new ExactMatch(label));
  if (c.name() == "numeric_answer") {
    if (c.tolerance() < 0) return absl::InvalidArgumentError(absl::StrCat(path, ".tolerance: must be >= 0"));
    return std::unique_ptr<Verifier>(new NumericAnswer(label, c.tolerance() > 0 ? c.tolerance() : 1e-6));
  }
  if (c.name() == "countdown") return std::unique_ptr<Verifier>(new Countdown(label));
  if (c.name() == "format") {
    if (c.pattern().empty()) return absl::InvalidArgumentError(absl::StrCat(path, ".pattern: required for format"));
    try {
      return std::unique_ptr<Verifier>(new Format(label, std::regex(c.pattern(), std::regex::ECMAScript)));
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".pattern: invalid regular expression: ", e.what()));
    }
  }
  if (c.name() == "length") {
    if (c.max_tokens() <= 0) return absl::InvalidArgumentError(absl::StrCat(path, ".max_tokens: must be > 0"));
    if (c.penalty_per_token() < 0) return absl::InvalidArgumentError(absl::StrCat(path, ".penalty_per_token: must be >= 0"));
    return std::unique_ptr<Verifier>(new Length(label, c.max_tokens(), c.penalty_per_token()));
  }
  if (c.name() == "command") {
    if (c.command().empty()) return absl::InvalidArgumentError(absl::StrCat(path, ".command: required for command"));
    if (::access(c.command(0).c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".command: not an executable: ", c.command(0)));
    }
    return std::unique_ptr<Verifier>(new Command(label, {c.command().begin(), c.command().end()}));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ".name: unknown verifier '", c.name(),
                   "' (exact_match, numeric_answer, countdown, format, length, command)"));
}

}  // namespace rlmesh
