#pragma once

// Internal to :chat_template. Tokens, the syntax tree, and the lexer and
// parser that produce them. Once parsed, a tree is never modified.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "actor/chat_template_value.h"

namespace rlmesh::actor::chat_template_internal {

// Statements and expressions nest at most this deep.
inline constexpr int kMaxSyntaxDepth = 100;

enum class TokenType {
  kData,           // template text between tags
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // text: the decoded value
  kInteger,
  kFloat,
  kOperator,  // text: the operator, e.g. "//" or "("
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Splits a template into tokens the way Jinja's lexer does with transformers'
// settings: trim_blocks and lstrip_blocks on, `-`/`+` whitespace control,
// comments dropped, {% raw %} kept verbatim, \r\n and \r read as \n and one
// trailing newline of the source dropped.
absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

enum class ExprKind {
  kLiteral,
  kName,
  kList,
  kTuple,
  kDict,     // args: key0, value0, key1, value1, ...
  kAttr,     // args[0].name
  kItem,     // args[0][args[1]]
  kSlice,    // args[0][args[1]:args[2]:args[3]], absent bounds null
  kCall,     // args[0](args[1..], kwargs)
  kFilter,   // args[0] | name(args[1..], kwargs); args[0] null in a {% set %} block
  kTest,     // args[0] is name(args[1..], kwargs)
  kNot,
  kNeg,
  kPos,
  kBinary,   // args[0] op args[1], op one of + - * / // % **
  kConcat,   // args joined by ~
  kAnd,
  kOr,
  kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...
  kCond,     // args[1] if args[0] else args[2] (null: undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  int depth = 1;                  // 1 + the deepest operand's depth
  Value literal;                  // kLiteral
  std::string name;               // kName, kAttr, kFilter, kTest; kBinary: the operator
  std::vector<std::string> ops;   // kCompare: "==", "!=", "<", "<=", ">", ">=", "in", "not in"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

enum class StmtKind {
  kText,
  kOutput,    // {{ expr }}
  kIf,        // expr; body; else_body (an elif is an If alone in else_body)
  kFor,       // targets in expr [if filter]; body; else_body
  kSet,       // targets = expr, or targets[0].attr = expr
  kSetBlock,  // targets[0] = captured body, through `filters` in order
  kBreak,
  kContinue,
  kBlock,     // body only ({% generation %})
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  std::string text;                  // kText
  ExprPtr expr;                      // kOutput, kIf test, kFor iterable, kSet value
  ExprPtr filter;                    // kFor: the `if` after the iterable
  std::vector<std::string> targets;  // kFor, kSet, kSetBlock names (several: unpacking)
  std::string attr;                  // kSet on a namespace attribute
  std::vector<ExprPtr> filters;      // kSetBlock: kFilter nodes with a null subject
  std::vector<StmtPtr> body;
  std::vector<StmtPtr> else_body;
};

// Parses a whole template. Errors name the line and the construct.
absl::StatusOr<std::vector<StmtPtr>> ParseTemplate(absl::string_view source);

// What a ChatTemplate holds.
struct Program {
  std::vector<StmtPtr> body;
};

// "chat template line N: <message>" with the code of `code`.
absl::Status ErrorAt(absl::StatusCode code, int line, absl::string_view message);

}  // namespace rlmesh::actor::chat_template_internal
