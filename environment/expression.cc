#include "environment/expression.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace rlmesh::environment {
namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  absl::StatusOr<double> Parse() {
    double v = Expr();
    Skip();
    if (error_.empty() && pos_ != s_.size()) Fail(absl::StrCat("unexpected '", std::string(1, s_[pos_]), "'"));
    if (!error_.empty()) return absl::InvalidArgumentError(error_);
    if (!std::isfinite(v)) return absl::InvalidArgumentError("result is not a finite number");
    return v;
  }

 private:
  void Fail(const std::string& why) {
    if (error_.empty()) error_ = absl::StrCat(why, " at position ", pos_);
  }
  void Skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    Skip();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool EatPow() {
    Skip();
    if (pos_ < s_.size() && s_[pos_] == '^') {
      ++pos_;
      return true;
    }
    if (pos_ + 1 < s_.size() && s_[pos_] == '*' && s_[pos_ + 1] == '*') {
      pos_ += 2;
      return true;
    }
    return false;
  }

  double Expr() {
    double v = Term();
    while (error_.empty()) {
      if (Eat('+')) {
        v += Term();
      } else if (Eat('-')) {
        v -= Term();
      } else {
        break;
      }
    }
    return v;
  }

  double Term() {
    double v = Unary();
    while (error_.empty()) {
      Skip();
      // "**" is a power, not two multiplications.
      if (pos_ + 1 < s_.size() && s_[pos_] == '*' && s_[pos_ + 1] == '*') break;
      if (Eat('*')) {
        v *= Unary();
      } else if (Eat('/')) {
        double d = Unary();
        if (d == 0 && error_.empty()) Fail("division by zero");
        v = d == 0 ? 0 : v / d;
      } else if (Eat('%')) {
        double d = Unary();
        if (d == 0 && error_.empty()) Fail("modulo by zero");
        v = d == 0 ? 0 : std::fmod(v, d);
      } else {
        break;
      }
    }
    return v;
  }

  double Unary() {
    if (Eat('-')) return -Unary();
    if (Eat('+')) return Unary();
    return Power();
  }

  double Power() {
    double base = Atom();
    if (error_.empty() && EatPow()) {
      double e = Unary();
      double v = std::pow(base, e);
      if (error_.empty() && !std::isfinite(v)) Fail("power overflows or is undefined");
      return v;
    }
    return base;
  }

  double Atom() {
    Skip();
    if (!error_.empty()) return 0;
    if (Eat('(')) {
      if (++depth_ > kMaxExpressionDepth) {
        Fail(absl::StrCat("nesting deeper than ", kMaxExpressionDepth));
        return 0;
      }
      double v = Expr();
      --depth_;
      if (!Eat(')')) Fail("missing ')'");
      return v;
    }
    const size_t start = pos_;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.')) ++pos_;
    if (pos_ == start) {
      Fail(pos_ < s_.size() ? absl::StrCat("unexpected '", std::string(1, s_[pos_]), "'") : "expected a number");
      return 0;
    }
    const std::string num = s_.substr(start, pos_ - start);
    char* end = nullptr;
    double v = std::strtod(num.c_str(), &end);
    if (end == nullptr || *end != '\0') {
      Fail(absl::StrCat("bad number '", num, "'"));
      return 0;
    }
    return v;
  }

  const std::string& s_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string error_;
};

}  // namespace

absl::StatusOr<double> EvaluateExpression(const std::string& text) {
  if (text.size() > static_cast<size_t>(kMaxExpressionChars)) {
    return absl::InvalidArgumentError(absl::StrCat("expression longer than ", kMaxExpressionChars, " characters"));
  }
  bool any = false;
  for (char c : text) any = any || !std::isspace(static_cast<unsigned char>(c));
  if (!any) return absl::InvalidArgumentError("empty expression");
  return Parser(text).Parse();
}

std::string FormatNumber(double value) {
  if (value == 0) return "0";  // also -0
  if (std::fabs(value) <= 1e15 && std::floor(value) == value) {
    return absl::StrCat(static_cast<long long>(value));
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.12g", value);
  return buf;
}

}  // namespace rlmesh::environment
