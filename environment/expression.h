#pragma once

// The calculator's arithmetic: a recursive-descent evaluator of one
// expression over double-precision numbers. Grammar:
//   expr   := term (('+' | '-') term)*
//   term   := unary (('*' | '/' | '%') unary)*
//   unary  := ('-' | '+') unary | power
//   power  := atom ('^' unary)?          (right-associative; "**" = "^")
//   atom   := number | '(' expr ')'
// Runs inside the sandboxed evaluator process (calc_eval), never in a
// server: a bug here can at worst kill that child. Pure; thread-safe.

#include <string>

#include "absl/status/statusor.h"

namespace rlmesh::environment {

// Longest expression accepted, characters; deepest parenthesis nesting.
inline constexpr int kMaxExpressionChars = 256;
inline constexpr int kMaxExpressionDepth = 32;

// INVALID_ARGUMENT naming the problem (syntax, division by zero, a
// non-finite result, too long / too deep).
absl::StatusOr<double> EvaluateExpression(const std::string& text);

// An integral value within +-1e15 as an integer ("408"), else up to 12
// significant digits ("0.333333333333").
std::string FormatNumber(double value);

}  // namespace rlmesh::environment
