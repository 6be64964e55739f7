// Over 600 lines: one grammar, one recursive-descent parser; its rules
// call each other and read best together.
//
// A recursive-descent parser with Jinja's grammar and operator precedence
// (lowest first): `x if c else y`, or, and, not, comparisons and `in`,
// + -, ~, * / // %, **, unary - +, then postfix `.a` `[i]` `(...)` with
// filters `|f` and tests `is t` binding to the operand before them.

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "actor/chat_template_ast.h"
#include "actor/chat_template_builtins.h"

namespace rlmesh::actor::chat_template_internal {
namespace {

// Parser recursion allowed (each level of brackets costs about three).
constexpr int kMaxParseRecursion = 3 * kMaxSyntaxDepth;

const char* const kUnsupportedTags[] = {"macro", "call", "filter", "include", "import",
                                        "from", "extends", "block", "with", "autoescape",
                                        "do", "trans"};

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kData: return "template text";
    case TokenType::kVariableBegin: return "'{{'";
    case TokenType::kVariableEnd: return "'}}'";
    case TokenType::kBlockBegin: return "'{%'";
    case TokenType::kBlockEnd: return "'%}'";
    case TokenType::kName: return absl::StrCat("'", t.text, "'");
    case TokenType::kString: return "a string";
    case TokenType::kInteger: return "an integer";
    case TokenType::kFloat: return "a float";
    case TokenType::kOperator: return absl::StrCat("'", t.text, "'");
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  absl::StatusOr<std::vector<StmtPtr>> ParseAll() { return Subparse({}); }

 private:
  struct OpenBlock {
    std::string tag;
    int line;
  };

  // Counts parser recursion; fails past the limit instead of overflowing.
  class Guard {
   public:
    explicit Guard(int* depth) : depth_(depth) { ++*depth_; }
    ~Guard() { --*depth_; }
    bool too_deep() const { return *depth_ > kMaxParseRecursion; }

   private:
    int* depth_;
  };

  const Token& Cur() const { return toks_[pos_]; }
  const Token& Peek() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
  void Advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool IsName(absl::string_view v) const { return Cur().type == TokenType::kName && Cur().text == v; }
  bool IsOp(absl::string_view v) const {
    return Cur().type == TokenType::kOperator && Cur().text == v;
  }
  bool IsEnd() const {
    return Cur().type == TokenType::kBlockEnd || Cur().type == TokenType::kVariableEnd;
  }

  absl::Status Fail(absl::string_view message) const {
    return ErrorAt(absl::StatusCode::kInvalidArgument, Cur().line, message);
  }
  absl::Status Unsupported(absl::string_view what) const {
    return ErrorAt(absl::StatusCode::kUnimplemented, Cur().line, absl::StrCat("unsupported ", what));
  }
  absl::Status Expected(absl::string_view what) const {
    return Fail(absl::StrCat("expected ", what, ", got ", Describe(Cur())));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!IsOp(op)) return Expected(absl::StrCat("'", op, "'"));
    Advance();
    return absl::OkStatus();
  }
  // The %} that opens a body; Jinja accepts a ':' before it.
  absl::Status ExpectBodyStart() {
    if (IsOp(":")) Advance();
    return ExpectBlockEnd();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) return Expected("'%}'");
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) return Expected("a name");
    std::string name = Cur().text;
    Advance();
    return name;
  }

  // Sets the node's line and checks the tree stays shallow enough to walk.
  absl::StatusOr<ExprPtr> Node(ExprKind kind, int line, std::vector<ExprPtr> args = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->args = std::move(args);
    return Finish(std::move(e));
  }
  absl::StatusOr<ExprPtr> Finish(ExprPtr e) {
    int depth = 0;
    for (const auto& a : e->args) depth = std::max(depth, a ? a->depth : 0);
    for (const auto& kv : e->kwargs) depth = std::max(depth, kv.second->depth);
    e->depth = depth + 1;
    if (e->depth > kMaxSyntaxDepth) {
      return ErrorAt(absl::StatusCode::kInvalidArgument, e->line,
                     absl::StrCat("expression nests deeper than ", kMaxSyntaxDepth, " levels"));
    }
    return e;
  }

  // ---- statements ----

  // Parses until a `{% tag %}` with a tag in `end_tags`, leaving the tag name
  // as the current token.
  absl::StatusOr<std::vector<StmtPtr>> Subparse(const std::vector<std::string>& end_tags) {
    std::vector<StmtPtr> body;
    while (true) {
      const Token& t = Cur();
      if (t.type == TokenType::kEof) {
        if (end_tags.empty()) return body;
        const OpenBlock& open = open_.back();
        return ErrorAt(absl::StatusCode::kInvalidArgument, open.line,
                       absl::StrCat("unclosed '", open.tag, "' block: reached the end of the ",
                                    "template looking for '", absl::StrJoin(end_tags, "' or '"),
                                    "'"));
      }
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        Advance();
      } else if (t.type == TokenType::kVariableBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = t.line;
        Advance();
        RLMESH_ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/true, "", false));
        if (Cur().type != TokenType::kVariableEnd) return Expected("'}}'");
        Advance();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        Advance();
        if (Cur().type == TokenType::kName &&
            std::find(end_tags.begin(), end_tags.end(), Cur().text) != end_tags.end()) {
          return body;
        }
        RLMESH_ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
        RLMESH_RETURN_IF_ERROR(ExpectBlockEnd());
        body.push_back(std::move(s));
      } else {
        return Fail(absl::StrCat("unexpected ", Describe(t)));
      }
    }
  }

  // A body ending at one of `end_tags`, inside the block `tag` opened at `line`.
  absl::StatusOr<std::vector<StmtPtr>> Body(const std::string& tag, int line,
                                            const std::vector<std::string>& end_tags) {
    if (static_cast<int>(open_.size()) >= kMaxSyntaxDepth) {
      return ErrorAt(absl::StatusCode::kInvalidArgument, line,
                     absl::StrCat("blocks nest deeper than ", kMaxSyntaxDepth, " levels"));
    }
    open_.push_back({tag, line});
    auto body = Subparse(end_tags);
    open_.pop_back();
    return body;
  }

  absl::StatusOr<StmtPtr> ParseStatement() {
    if (Cur().type != TokenType::kName) return Expected("a tag name");
    const std::string tag = Cur().text;
    auto s = std::make_unique<Stmt>();
    s->line = Cur().line;
    if (tag == "for") return ParseFor(std::move(s));
    if (tag == "if") return ParseIf(std::move(s));
    if (tag == "set") return ParseSet(std::move(s));
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return Fail(absl::StrCat("'", tag, "' outside a for loop"));
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      Advance();
      return s;
    }
    if (tag == "generation") {  // transformers' assistant-mask tag: renders its body
      s->kind = StmtKind::kBlock;
      Advance();
      RLMESH_RETURN_IF_ERROR(ExpectBodyStart());
      RLMESH_ASSIGN_OR_RETURN(s->body, Body(tag, s->line, {"endgeneration"}));
      Advance();
      return s;
    }
    for (const char* t : kUnsupportedTags) {
      if (tag == t) return Unsupported(absl::StrCat("tag '", tag, "'"));
    }
    std::string where;
    if (!open_.empty()) {
      where = absl::StrCat(" (innermost open block: '", open_.back().tag, "' from line ",
                           open_.back().line, ")");
    }
    if (tag.rfind("end", 0) == 0 || tag == "else" || tag == "elif") {
      return Fail(absl::StrCat("unexpected '", tag, "'", where));
    }
    return Fail(absl::StrCat("unknown tag '", tag, "'", where));
  }

  absl::StatusOr<StmtPtr> ParseFor(StmtPtr s) {
    s->kind = StmtKind::kFor;
    Advance();
    RLMESH_ASSIGN_OR_RETURN(s->targets, ParseTargets());
    if (!IsName("in")) return Expected("'in'");
    Advance();
    RLMESH_ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/false, "recursive", false));
    if (IsName("if")) {
      Advance();
      RLMESH_ASSIGN_OR_RETURN(s->filter, ParseExpression(true));
    }
    if (IsName("recursive")) return Unsupported("recursive for loop");
    RLMESH_RETURN_IF_ERROR(ExpectBodyStart());
    ++loop_depth_;
    auto body = Body("for", s->line, {"endfor", "else"});
    --loop_depth_;
    if (!body.ok()) return body.status();
    s->body = *std::move(body);
    if (IsName("else")) {
      Advance();
      RLMESH_RETURN_IF_ERROR(ExpectBodyStart());
      // `break` in a for's else belongs to an enclosing loop, if any.
      RLMESH_ASSIGN_OR_RETURN(s->else_body, Body("for", s->line, {"endfor"}));
    }
    Advance();  // endfor
    return s;
  }

  absl::StatusOr<StmtPtr> ParseIf(StmtPtr s) {
    s->kind = StmtKind::kIf;
    Advance();
    RLMESH_ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/false, "", false));
    RLMESH_RETURN_IF_ERROR(ExpectBodyStart());
    RLMESH_ASSIGN_OR_RETURN(s->body, Body("if", s->line, {"elif", "else", "endif"}));
    if (IsName("elif")) {
      // An elif is an if in the else branch; it ends at the same endif.
      auto nested = std::make_unique<Stmt>();
      nested->line = Cur().line;
      if (static_cast<int>(open_.size()) >= kMaxSyntaxDepth) {
        return Fail(absl::StrCat("blocks nest deeper than ", kMaxSyntaxDepth, " levels"));
      }
      open_.push_back({"if", s->line});
      auto parsed = ParseIf(std::move(nested));
      open_.pop_back();
      if (!parsed.ok()) return parsed.status();
      s->else_body.push_back(*std::move(parsed));
      return s;
    }
    if (IsName("else")) {
      Advance();
      RLMESH_RETURN_IF_ERROR(ExpectBodyStart());
      RLMESH_ASSIGN_OR_RETURN(s->else_body, Body("if", s->line, {"endif"}));
    }
    Advance();  // endif
    return s;
  }

  absl::StatusOr<StmtPtr> ParseSet(StmtPtr s) {
    Advance();
    RLMESH_ASSIGN_OR_RETURN(std::string first, ExpectName());
    if (IsOp(".")) {
      Advance();
      RLMESH_ASSIGN_OR_RETURN(s->attr, ExpectName());
      s->targets = {first};
    } else {
      pos_ -= 1;
      RLMESH_ASSIGN_OR_RETURN(s->targets, ParseTargets());
    }
    if (IsOp("=")) {
      Advance();
      s->kind = StmtKind::kSet;
      RLMESH_ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/true, "", false));
      return s;
    }
    if (s->targets.size() != 1) return Expected("'='");
    s->kind = StmtKind::kSetBlock;
    while (IsOp("|")) {
      RLMESH_ASSIGN_OR_RETURN(ExprPtr f, ParseFilter(nullptr));
      s->filters.push_back(std::move(f));
    }
    RLMESH_RETURN_IF_ERROR(ExpectBodyStart());
    RLMESH_ASSIGN_OR_RETURN(s->body, Body("set", s->line, {"endset"}));
    Advance();  // endset
    return s;
  }

  // Names to assign: `x`, `k, v`, `(k, v)`.
  absl::StatusOr<std::vector<std::string>> ParseTargets() {
    const bool parens = IsOp("(");
    if (parens) Advance();
    std::vector<std::string> names;
    while (true) {
      if (Cur().type != TokenType::kName) return Expected("a variable name to assign");
      const std::string& n = Cur().text;
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None") {
        return Fail(absl::StrCat("cannot assign to '", n, "'"));
      }
      names.push_back(n);
      Advance();
      if (!IsOp(",")) break;
      Advance();
      if (parens && IsOp(")")) break;  // a trailing comma, only inside (...)
    }
    if (parens) RLMESH_RETURN_IF_ERROR(ExpectOp(")"));
    return names;
  }

  // ---- expressions ----

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }

  // Comma-separated expressions: a tuple if there is a comma, else the one
  // expression. Stops at `}}`, `%}`, `)` and at the name `extra_end`.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, absl::string_view extra_end,
                                     bool explicit_parens) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) RLMESH_RETURN_IF_ERROR(ExpectOp(","));
      if (IsEnd() || IsOp(")") || (!extra_end.empty() && IsName(extra_end))) break;
      RLMESH_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condexpr));
      items.push_back(std::move(e));
      if (!IsOp(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) return Expected("an expression");
    }
    return Node(ExprKind::kTuple, line, std::move(items));
  }

  absl::StatusOr<ExprPtr> ParseCondExpr() {
    Guard guard(&recursion_);
    if (guard.too_deep()) return Fail("expression nests too deeply");
    const int line = Cur().line;
    RLMESH_ASSIGN_OR_RETURN(ExprPtr value, ParseOr());
    while (IsName("if")) {
      Advance();
      std::vector<ExprPtr> args(3);
      RLMESH_ASSIGN_OR_RETURN(args[0], ParseOr());
      args[1] = std::move(value);
      if (IsName("else")) {
        Advance();
        RLMESH_ASSIGN_OR_RETURN(args[2], ParseCondExpr());
      }
      RLMESH_ASSIGN_OR_RETURN(value, Node(ExprKind::kCond, line, std::move(args)));
    }
    return value;
  }

  // Left-associative chains: or, and, + -, * / // %, **.
  template <typename Next>
  absl::StatusOr<ExprPtr> Chain(Next next, std::initializer_list<const char*> ops, bool names,
                                ExprKind kind) {
    const int line = Cur().line;
    RLMESH_ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (true) {
      const char* hit = nullptr;
      for (const char* op : ops) {
        if (names ? IsName(op) : IsOp(op)) hit = op;
      }
      if (hit == nullptr) return left;
      Advance();
      std::vector<ExprPtr> args(2);
      args[0] = std::move(left);
      RLMESH_ASSIGN_OR_RETURN(args[1], (this->*next)());
      RLMESH_ASSIGN_OR_RETURN(left, Node(kind, line, std::move(args)));
      left->name = hit;
    }
  }

  absl::StatusOr<ExprPtr> ParseOr() { return Chain(&Parser::ParseAnd, {"or"}, true, ExprKind::kOr); }
  absl::StatusOr<ExprPtr> ParseAnd() {
    return Chain(&Parser::ParseNot, {"and"}, true, ExprKind::kAnd);
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (!IsName("not")) return ParseCompare();
    Guard guard(&recursion_);
    if (guard.too_deep()) return Fail("expression nests too deeply");
    const int line = Cur().line;
    Advance();
    std::vector<ExprPtr> args(1);
    RLMESH_ASSIGN_OR_RETURN(args[0], ParseNot());
    return Node(ExprKind::kNot, line, std::move(args));
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    RLMESH_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    std::vector<ExprPtr> args;
    std::vector<std::string> ops;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOperator &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
           Cur().text == ">" || Cur().text == ">=")) {
        op = Cur().text;
        Advance();
      } else if (IsName("in")) {
        op = "in";
        Advance();
      } else if (IsName("not") && Peek().type == TokenType::kName && Peek().text == "in") {
        op = "not in";
        Advance();
        Advance();
      } else {
        break;
      }
      if (args.empty()) args.push_back(std::move(first));
      RLMESH_ASSIGN_OR_RETURN(ExprPtr rhs, ParseMath1());
      args.push_back(std::move(rhs));
      ops.push_back(op);
    }
    if (args.empty()) return first;
    RLMESH_ASSIGN_OR_RETURN(ExprPtr e, Node(ExprKind::kCompare, line, std::move(args)));
    e->ops = std::move(ops);
    return e;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    return Chain(&Parser::ParseConcat, {"+", "-"}, false, ExprKind::kBinary);
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const int line = Cur().line;
    RLMESH_ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp("~")) return first;
    std::vector<ExprPtr> args;
    args.push_back(std::move(first));
    while (IsOp("~")) {
      Advance();
      RLMESH_ASSIGN_OR_RETURN(ExprPtr e, ParseMath2());
      args.push_back(std::move(e));
    }
    return Node(ExprKind::kConcat, line, std::move(args));
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    return Chain(&Parser::ParsePow, {"*", "/", "//", "%"}, false, ExprKind::kBinary);
  }
  absl::StatusOr<ExprPtr> ParsePow() {
    return Chain(&Parser::ParseUnaryWithFilters, {"**"}, false, ExprKind::kBinary);
  }
  absl::StatusOr<ExprPtr> ParseUnaryWithFilters() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Guard guard(&recursion_);
    if (guard.too_deep()) return Fail("expression nests too deeply");
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const ExprKind kind = IsOp("-") ? ExprKind::kNeg : ExprKind::kPos;
      Advance();
      std::vector<ExprPtr> args(1);
      RLMESH_ASSIGN_OR_RETURN(args[0], ParseUnary(false));
      RLMESH_ASSIGN_OR_RETURN(node, Node(kind, line, std::move(args)));
    } else {
      RLMESH_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    RLMESH_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      while (true) {
        if (IsOp("|")) {
          RLMESH_ASSIGN_OR_RETURN(node, ParseFilter(std::move(node)));
        } else if (IsName("is")) {
          RLMESH_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
        } else if (IsOp("(")) {
          RLMESH_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
        } else {
          break;
        }
      }
    }
    return node;
  }

  absl::StatusOr<ExprPtr> Literal(Value v, int line) {
    RLMESH_ASSIGN_OR_RETURN(ExprPtr e, Node(ExprKind::kLiteral, line));
    e->literal = std::move(v);
    return e;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    const int line = t.line;
    switch (t.type) {
      case TokenType::kName: {
        const std::string n = t.text;
        Advance();
        if (n == "true" || n == "True") return Literal(Value::Bool(true), line);
        if (n == "false" || n == "False") return Literal(Value::Bool(false), line);
        if (n == "none" || n == "None") return Literal(Value::None(), line);
        RLMESH_ASSIGN_OR_RETURN(ExprPtr e, Node(ExprKind::kName, line));
        e->name = n;
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {  // adjacent literals join
          s += Cur().text;
          Advance();
        }
        return Literal(Value::String(std::move(s)), line);
      }
      case TokenType::kInteger: {
        const int64_t v = t.int_value;
        Advance();
        return Literal(Value::Int(v), line);
      }
      case TokenType::kFloat: {
        const double v = t.float_value;
        Advance();
        return Literal(Value::Float(v), line);
      }
      case TokenType::kOperator:
        if (t.text == "(") {
          Advance();
          RLMESH_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(/*with_condexpr=*/true, "", true));
          RLMESH_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.text == "[" || t.text == "{") {
          const bool dict = t.text == "{";
          const std::string close = dict ? "}" : "]";
          Advance();
          std::vector<ExprPtr> items;
          while (!IsOp(close)) {
            if (!items.empty()) {
              RLMESH_RETURN_IF_ERROR(ExpectOp(","));
              if (IsOp(close)) break;
            }
            RLMESH_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
            items.push_back(std::move(e));
            if (dict) {
              RLMESH_RETURN_IF_ERROR(ExpectOp(":"));
              RLMESH_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
              items.push_back(std::move(v));
            }
          }
          Advance();
          return Node(dict ? ExprKind::kDict : ExprKind::kList, line, std::move(items));
        }
        break;
      default:
        break;
    }
    return Fail(absl::StrCat("unexpected ", Describe(t)));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const int line = Cur().line;
      if (IsOp(".")) {
        Advance();
        std::vector<ExprPtr> args(1);
        args[0] = std::move(node);
        if (Cur().type == TokenType::kName) {
          const std::string attr = Cur().text;
          Advance();
          RLMESH_ASSIGN_OR_RETURN(node, Node(ExprKind::kAttr, line, std::move(args)));
          node->name = attr;
        } else if (Cur().type == TokenType::kInteger) {
          RLMESH_ASSIGN_OR_RETURN(ExprPtr index, Literal(Value::Int(Cur().int_value), line));
          Advance();
          args.push_back(std::move(index));
          RLMESH_ASSIGN_OR_RETURN(node, Node(ExprKind::kItem, line, std::move(args)));
        } else {
          return Expected("a name or number after '.'");
        }
      } else if (IsOp("[")) {
        Advance();
        RLMESH_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node), line));
      } else if (IsOp("(")) {
        RLMESH_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  // After `[`: an index, a slice `a:b:c` with any part absent, or several
  // comma-separated keys (a tuple).
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node, int line) {
    std::vector<ExprPtr> keys;
    bool slice = false;
    std::vector<ExprPtr> bounds(3);
    while (!IsOp("]")) {
      if (!keys.empty() || slice) RLMESH_RETURN_IF_ERROR(ExpectOp(","));
      ExprPtr start;
      if (!IsOp(":")) {
        RLMESH_ASSIGN_OR_RETURN(start, ParseExpression(true));
        if (!IsOp(":")) {
          keys.push_back(std::move(start));
          continue;
        }
      }
      if (slice || !keys.empty()) return Unsupported("multi-dimensional subscript");
      slice = true;
      Advance();  // the first ':'
      bounds[0] = std::move(start);
      if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
        RLMESH_ASSIGN_OR_RETURN(bounds[1], ParseExpression(true));
      }
      if (IsOp(":")) {
        Advance();
        if (!IsOp("]") && !IsOp(",")) {
          RLMESH_ASSIGN_OR_RETURN(bounds[2], ParseExpression(true));
        }
      }
    }
    Advance();  // ]
    std::vector<ExprPtr> args;
    args.push_back(std::move(node));
    if (slice) {
      if (!keys.empty()) return Unsupported("multi-dimensional subscript");
      for (auto& b : bounds) args.push_back(std::move(b));
      return Node(ExprKind::kSlice, line, std::move(args));
    }
    if (keys.empty()) return Fail("expected a subscript expression");
    if (keys.size() == 1) {
      args.push_back(std::move(keys[0]));
    } else {
      RLMESH_ASSIGN_OR_RETURN(ExprPtr tuple, Node(ExprKind::kTuple, line, std::move(keys)));
      args.push_back(std::move(tuple));
    }
    return Node(ExprKind::kItem, line, std::move(args));
  }

  // `(a, b, k=v)` into e->args (after whatever is already there) and kwargs.
  absl::Status ParseCallArgs(Expr* e) {
    RLMESH_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) {
        RLMESH_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      first = false;
      if (IsOp("*") || IsOp("**")) return Unsupported("*args/**kwargs in a call");
      if (Cur().type == TokenType::kName && Peek().type == TokenType::kOperator &&
          Peek().text == "=") {
        std::string key = Cur().text;
        for (const auto& kv : e->kwargs) {
          if (kv.first == key) return Fail(absl::StrCat("keyword argument repeated: ", key));
        }
        Advance();
        Advance();
        RLMESH_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!e->kwargs.empty()) return Fail("positional argument after a keyword argument");
        RLMESH_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        e->args.push_back(std::move(v));
      }
    }
    Advance();  // )
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto e = std::make_unique<Expr>();
    e->kind = ExprKind::kCall;
    e->line = Cur().line;
    e->args.push_back(std::move(callee));
    RLMESH_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return Finish(std::move(e));
  }

  absl::StatusOr<std::string> DottedName() {
    RLMESH_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".")) {
      Advance();
      RLMESH_ASSIGN_OR_RETURN(std::string part, ExpectName());
      name += "." + part;
    }
    return name;
  }

  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr subject) {
    Advance();  // |
    auto e = std::make_unique<Expr>();
    e->kind = ExprKind::kFilter;
    e->line = Cur().line;
    RLMESH_ASSIGN_OR_RETURN(e->name, DottedName());
    if (!IsKnownFilter(e->name)) {
      return ErrorAt(absl::StatusCode::kUnimplemented, e->line,
                     absl::StrCat("unsupported filter '", e->name, "'"));
    }
    e->args.push_back(std::move(subject));
    if (IsOp("(")) RLMESH_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return Finish(std::move(e));
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr subject) {
    Advance();  // is
    const int line = Cur().line;
    bool negated = false;
    if (IsName("not")) {
      negated = true;
      Advance();
    }
    auto e = std::make_unique<Expr>();
    e->kind = ExprKind::kTest;
    e->line = line;
    RLMESH_ASSIGN_OR_RETURN(e->name, DottedName());
    if (!IsKnownTest(e->name)) {
      return ErrorAt(absl::StatusCode::kUnimplemented, line,
                     absl::StrCat("unsupported test '", e->name, "'"));
    }
    e->args.push_back(std::move(subject));
    const TokenType t = Cur().type;
    if (IsOp("(")) {
      RLMESH_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    } else if ((t == TokenType::kName || t == TokenType::kString || t == TokenType::kInteger ||
                t == TokenType::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      // `x is divisibleby 3`: one argument without parentheses.
      if (IsName("is")) return Fail("cannot chain tests with 'is'");
      RLMESH_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      RLMESH_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      e->args.push_back(std::move(arg));
    }
    RLMESH_ASSIGN_OR_RETURN(ExprPtr test, Finish(std::move(e)));
    if (!negated) return test;
    std::vector<ExprPtr> args(1);
    args[0] = std::move(test);
    return Node(ExprKind::kNot, line, std::move(args));
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  std::vector<OpenBlock> open_;
  int loop_depth_ = 0;
  int recursion_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<StmtPtr>> ParseTemplate(absl::string_view source) {
  RLMESH_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).ParseAll();
}

}  // namespace rlmesh::actor::chat_template_internal
