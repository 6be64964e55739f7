// Scoping follows Jinja: `if` opens no scope; each iteration of a `for` gets
// a fresh scope over the enclosing ones, so a `set` inside a loop is gone at
// the next iteration and after the loop (templates carry state out of loops
// in a namespace). Arithmetic and comparisons follow Python, whose operators
// Jinja compiles to.

#include "actor/chat_template_eval.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rlmesh::actor::chat_template_internal {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

absl::Status AtLine(const absl::Status& s, int line) {
  if (absl::StartsWith(s.message(), "chat template line ")) return s;
  return ErrorAt(s.code(), line, s.message());
}

absl::Status TypeError(absl::string_view op, const Value& a, const Value& b) {
  return absl::InvalidArgumentError(absl::StrCat("unsupported operand type(s) for ", op, ": '",
                                                 TypeName(a), "' and '", TypeName(b), "'"));
}

absl::StatusOr<Value> CheckedInt(bool overflow, int64_t v) {
  if (overflow) return absl::OutOfRangeError("integer overflow (beyond 64 bits)");
  return Value::Int(v);
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t n, int64_t limit) {
  n = std::max<int64_t>(n, 0);
  const int64_t unit = seq.is_string() ? static_cast<int64_t>(seq.str().size())
                                       : static_cast<int64_t>(seq.items().size());
  if (unit > 0 && n > limit / unit) {
    return absl::ResourceExhaustedError(
        absl::StrCat("repetition would exceed the ", limit, "-byte output limit"));
  }
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::String(std::move(out));
  }
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
}

absl::StatusOr<Value> Arith(const std::string& op, const Value& a, const Value& b, int64_t limit) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const bool ints = a.is_integral() && b.is_integral();
  const bool nums = a.is_number() && b.is_number();
  int64_t r = 0;
  if (op == "+") {
    if (ints) {
      const bool overflow = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
      return CheckedInt(overflow, r);
    }
    if (nums) return Value::Float(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) return Value::String(a.str() + b.str());
    if (a.is_sequence() && a.kind() == b.kind()) {
      ValueList out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return a.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
    }
  } else if (op == "-") {
    if (ints) {
      const bool overflow = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
      return CheckedInt(overflow, r);
    }
    if (nums) return Value::Float(a.as_double() - b.as_double());
  } else if (op == "*") {
    if (ints) {
      const bool overflow = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
      return CheckedInt(overflow, r);
    }
    if (nums) return Value::Float(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_sequence()) && b.is_integral()) return Repeat(a, b.as_int(), limit);
    if ((b.is_string() || b.is_sequence()) && a.is_integral()) return Repeat(b, a.as_int(), limit);
  } else if (op == "/" || op == "//" || op == "%") {
    if (nums) {
      if (b.as_double() == 0) return absl::InvalidArgumentError("division by zero");
      if (op == "/") return Value::Float(a.as_double() / b.as_double());
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (x == INT64_MIN && y == -1) return CheckedInt(true, 0);
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors toward -infinity
          --q;
          m += y;
        }
        return Value::Int(op == "//" ? q : m);
      }
      const double x = a.as_double(), y = b.as_double();
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      if (op == "%") return Value::Float(m);
      return Value::Float(std::floor((x - m) / y + 0.5));
    }
    if (op == "%" && a.is_string()) return absl::UnimplementedError("unsupported: string % formatting");
  } else if (op == "**") {
    if (ints && b.as_int() >= 0) {
      const int64_t base = a.as_int(), exp = b.as_int();
      if (base == 0 || base == 1) return Value::Int(exp == 0 ? 1 : base);
      if (base == -1) return Value::Int(exp % 2 == 0 ? 1 : -1);
      int64_t result = 1;
      for (int64_t e = 0; e < exp; ++e) {  // |base| >= 2 overflows within 63 steps
        if (__builtin_mul_overflow(result, base, &result)) return CheckedInt(true, 0);
      }
      return Value::Int(result);
    }
    if (nums) {
      if (a.as_double() == 0 && b.as_double() < 0) {
        return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
      }
      return Value::Float(std::pow(a.as_double(), b.as_double()));
    }
  }
  return TypeError(op, a, b);
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return absl::StrContains(container.str(), item.str());
    case Value::Kind::kGenerator:
      RLMESH_RETURN_IF_ERROR(container.generator_error());
      [[fallthrough]];
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& v : container.items()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (item.is_sequence() || item.is_dict()) {
        return absl::InvalidArgumentError(absl::StrCat("unhashable type: '", TypeName(item), "'"));
      }
      return item.is_string() && container.Find(item.str()) != nullptr;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

class Evaluator {
 public:
  Evaluator(const ValueDict& context, const RenderSettings& settings) : settings_(settings) {
    scopes_.emplace_back();
    for (const auto& [key, value] : context) scopes_[0][key] = value;
  }

  absl::Status Exec(const std::vector<StmtPtr>& body, Flow* flow) {
    for (const StmtPtr& s : body) {
      RLMESH_RETURN_IF_ERROR(ExecOne(*s, flow));
      if (*flow != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  std::string TakeOutput() { return std::move(out_); }

 private:
  using Scope = absl::flat_hash_map<std::string, Value>;

  absl::Status Append(absl::string_view text, int line) {
    out_.append(text.data(), text.size());
    if (static_cast<int64_t>(out_.size()) > settings_.max_output_bytes) {
      return ErrorAt(absl::StatusCode::kResourceExhausted, line,
                     absl::StrCat("output exceeds ", settings_.max_output_bytes, " bytes"));
    }
    return absl::OkStatus();
  }

  absl::Status CountIteration(int line) {
    if (++iterations_ > settings_.max_loop_iterations) {
      return ErrorAt(absl::StatusCode::kResourceExhausted, line,
                     absl::StrCat("loops ran more than ", settings_.max_loop_iterations,
                                  " iterations"));
    }
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto hit = it->find(name);
      if (hit != it->end()) return hit->second;
    }
    Value global = LookupGlobal(name);
    if (!global.is_undefined()) return global;
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  // Assigns one value to `targets`, unpacking it when there are several.
  absl::Status Bind(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = v;
      return absl::OkStatus();
    }
    auto items = Iterate(v);
    if (!items.ok()) return AtLine(items.status(), line);
    if (items->size() != targets.size()) {
      return ErrorAt(absl::StatusCode::kInvalidArgument, line,
                     absl::StrCat("cannot unpack ", items->size(), " values into ",
                                  targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = (*items)[i];
    return absl::OkStatus();
  }

  absl::Status ExecOne(const Stmt& s, Flow* flow) {
    switch (s.kind) {
      case StmtKind::kText: return Append(s.text, s.line);
      case StmtKind::kOutput: {
        RLMESH_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        return Append(Str(v), s.line);
      }
      case StmtKind::kIf: {
        RLMESH_ASSIGN_OR_RETURN(Value test, Eval(*s.expr));
        return Exec(Truthy(test) ? s.body : s.else_body, flow);
      }
      case StmtKind::kFor: return ExecFor(s, flow);
      case StmtKind::kSet: {
        RLMESH_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        return Assign(s, v);
      }
      case StmtKind::kSetBlock: {
        const size_t mark = out_.size();
        RLMESH_RETURN_IF_ERROR(Exec(s.body, flow));
        if (*flow != Flow::kNormal) {
          return ErrorAt(absl::StatusCode::kUnimplemented, s.line,
                         "unsupported: break/continue inside {% set %} ... {% endset %}");
        }
        Value v = Value::String(out_.substr(mark));
        out_.resize(mark);
        for (const ExprPtr& f : s.filters) {
          RLMESH_ASSIGN_OR_RETURN(v, ApplyFilterExpr(*f, v));
        }
        return Assign(s, v);
      }
      case StmtKind::kBreak: *flow = Flow::kBreak; return absl::OkStatus();
      case StmtKind::kContinue: *flow = Flow::kContinue; return absl::OkStatus();
      case StmtKind::kBlock: return Exec(s.body, flow);
    }
    return absl::OkStatus();
  }

  absl::Status Assign(const Stmt& s, const Value& v) {
    if (s.attr.empty()) return Bind(s.targets, v, s.line);
    const Value ns = Lookup(s.targets[0]);
    if (ns.kind() != Value::Kind::kNamespace) {
      return ErrorAt(absl::StatusCode::kInvalidArgument, s.line,
                     absl::StrCat("cannot assign attribute on non-namespace object '",
                                  s.targets[0], "'"));
    }
    if (v.holds_reference()) {
      return ErrorAt(absl::StatusCode::kUnimplemented, s.line,
                     "unsupported: storing a namespace, loop or function in a namespace");
    }
    if (!s.attr.empty() && s.attr[0] == '_') {
      return ErrorAt(absl::StatusCode::kInvalidArgument, s.line,
                     "namespace attributes may not start with '_'");
    }
    for (auto& kv : ns.ns().attrs) {
      if (kv.first == s.attr) {
        kv.second = v;
        return absl::OkStatus();
      }
    }
    ns.ns().attrs.emplace_back(s.attr, v);
    return absl::OkStatus();
  }

  absl::Status ExecFor(const Stmt& s, Flow* flow) {
    RLMESH_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr));
    auto all = Iterate(iterable);
    if (!all.ok()) return AtLine(all.status(), s.line);
    ValueList items;
    if (s.filter == nullptr) {
      items = *std::move(all);
    } else {
      for (Value& item : *all) {
        RLMESH_RETURN_IF_ERROR(CountIteration(s.line));
        scopes_.emplace_back();
        absl::Status st = Bind(s.targets, item, s.line);
        absl::StatusOr<Value> keep = st.ok() ? Eval(*s.filter) : st;
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (Truthy(*keep)) items.push_back(std::move(item));
      }
    }
    auto state = std::make_shared<LoopState>();
    state->items = std::make_shared<const ValueList>(std::move(items));
    const Value loop = Value::Loop(state);
    // Jinja's else runs unless some iteration reached the end of the body: a
    // body left by break or continue does not count.
    bool completed = false;
    for (size_t i = 0; i < state->items->size(); ++i) {
      RLMESH_RETURN_IF_ERROR(CountIteration(s.line));
      state->index0 = static_cast<int64_t>(i);
      scopes_.emplace_back();
      Flow inner = Flow::kNormal;
      absl::Status st = Bind(s.targets, (*state->items)[i], s.line);
      if (st.ok()) {
        scopes_.back()["loop"] = loop;
        st = Exec(s.body, &inner);
      }
      scopes_.pop_back();
      RLMESH_RETURN_IF_ERROR(st);
      if (inner == Flow::kBreak) break;
      completed |= inner == Flow::kNormal;
    }
    if (completed || s.else_body.empty()) return absl::OkStatus();
    scopes_.emplace_back();
    absl::Status st = Exec(s.else_body, flow);
    scopes_.pop_back();
    return st;
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) {
      RLMESH_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.kwargs) {
      RLMESH_ASSIGN_OR_RETURN(Value v, Eval(*expr));
      args.keyword.emplace_back(key, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> ApplyFilterExpr(const Expr& e, const Value& subject) {
    RLMESH_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
    auto v = ApplyFilter(e.name, subject, args, settings_.builtins);
    if (!v.ok()) return AtLine(v.status(), e.line);
    return v;
  }

  // Every value built is checked here, so no string or list grows past the
  // output limit and no container nests past kMaxValueDepth.
  absl::StatusOr<Value> Eval(const Expr& e) {
    auto v = EvalUnchecked(e);
    if (!v.ok()) return AtLine(v.status(), e.line);
    const int64_t size = v->is_string() ? static_cast<int64_t>(v->str().size())
                         : v->is_sequence() ? static_cast<int64_t>(v->items().size()) : 0;
    if (size > settings_.max_output_bytes) {
      return ErrorAt(absl::StatusCode::kResourceExhausted, e.line,
                     absl::StrCat("a value exceeds the ", settings_.max_output_bytes,
                                  "-byte output limit"));
    }
    if (v->depth() > kMaxValueDepth) {
      return ErrorAt(absl::StatusCode::kResourceExhausted, e.line,
                     absl::StrCat("a value nests deeper than ", kMaxValueDepth, " levels"));
    }
    return v;
  }

  // Long because: one switch over every expression kind, each case a few lines; split, the
  // evaluator's dispatch would be scattered.
  absl::StatusOr<Value> EvalUnchecked(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: return Lookup(e.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        ValueList items;
        for (const auto& a : e.args) {
          RLMESH_ASSIGN_OR_RETURN(Value v, Eval(*a));
          items.push_back(std::move(v));
        }
        return e.kind == ExprKind::kList ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
      }
      case ExprKind::kDict: {
        ValueDict items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          RLMESH_ASSIGN_OR_RETURN(Value key, Eval(*e.args[i]));
          RLMESH_ASSIGN_OR_RETURN(Value value, Eval(*e.args[i + 1]));
          if (!key.is_string()) return absl::UnimplementedError("unsupported: non-string dict keys");
          auto same = std::find_if(items.begin(), items.end(),
                                   [&](const auto& kv) { return kv.first == key.str(); });
          if (same != items.end()) {
            same->second = std::move(value);
          } else {
            items.emplace_back(key.str(), std::move(value));
          }
        }
        return Value::Dict(std::move(items));
      }
      case ExprKind::kAttr: {
        RLMESH_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return GetAttr(obj, e.name);
      }
      case ExprKind::kItem: {
        RLMESH_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        RLMESH_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(obj, key);
      }
      case ExprKind::kSlice: {
        RLMESH_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        Value bounds[3] = {Value::None(), Value::None(), Value::None()};
        for (int i = 0; i < 3; ++i) {
          if (e.args[i + 1]) {
            RLMESH_ASSIGN_OR_RETURN(bounds[i], Eval(*e.args[i + 1]));
          }
        }
        return GetSlice(obj, bounds[0], bounds[1], bounds[2]);
      }
      case ExprKind::kCall: {
        RLMESH_ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0]));
        RLMESH_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return CallValue(callee, args, settings_.builtins);
      }
      case ExprKind::kFilter: {
        RLMESH_ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        return ApplyFilterExpr(e, subject);
      }
      case ExprKind::kTest: {
        RLMESH_ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        RLMESH_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        RLMESH_ASSIGN_OR_RETURN(bool b, ApplyTest(e.name, subject, args));
        return Value::Bool(b);
      }
      case ExprKind::kNot: {
        RLMESH_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(!Truthy(v));
      }
      case ExprKind::kNeg:
      case ExprKind::kPos: {
        RLMESH_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.is_undefined()) return UndefinedError(v);
        if (!v.is_number()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "bad operand type for unary ", e.kind == ExprKind::kNeg ? "-" : "+", ": '",
              TypeName(v), "'"));
        }
        if (e.kind == ExprKind::kPos) return v.is_integral() ? Value::Int(v.as_int()) : v;
        if (!v.is_integral()) return Value::Float(-v.as_double());
        if (v.as_int() == INT64_MIN) return CheckedInt(true, 0);
        return Value::Int(-v.as_int());
      }
      case ExprKind::kBinary: {
        RLMESH_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        RLMESH_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        return Arith(e.name, a, b, settings_.max_output_bytes);
      }
      case ExprKind::kConcat: {
        std::string out;
        for (const auto& a : e.args) {
          RLMESH_ASSIGN_OR_RETURN(Value v, Eval(*a));
          out += Str(v);
          if (static_cast<int64_t>(out.size()) > settings_.max_output_bytes) {
            return absl::ResourceExhaustedError("a string exceeds the output limit");
          }
        }
        return Value::String(std::move(out));
      }
      case ExprKind::kAnd:
      case ExprKind::kOr: {
        RLMESH_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (Truthy(a) == (e.kind == ExprKind::kOr)) return a;
        return Eval(*e.args[1]);
      }
      case ExprKind::kCompare: {
        RLMESH_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          RLMESH_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
          RLMESH_ASSIGN_OR_RETURN(bool holds, CompareOp(e.ops[i], left, right));
          if (!holds) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case ExprKind::kCond: {
        RLMESH_ASSIGN_OR_RETURN(Value test, Eval(*e.args[0]));
        if (Truthy(test)) return Eval(*e.args[1]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value::Undefined("the inline if-expression evaluated to false and has no else");
      }
    }
    return absl::InternalError("unknown expression kind");
  }

  static absl::StatusOr<bool> CompareOp(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Equals(a, b);
    if (op == "!=") return !Equals(a, b);
    if (op == "in") return Contains(b, a);
    if (op == "not in") {
      RLMESH_ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return !in;
    }
    if (a.is_undefined()) return UndefinedError(a);
    if (b.is_undefined()) return UndefinedError(b);
    RLMESH_ASSIGN_OR_RETURN(int c, Compare(a, b));
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  const RenderSettings& settings_;
  std::vector<Scope> scopes_;  // [0]: the context and top-level sets
  std::string out_;
  int64_t iterations_ = 0;
};

}  // namespace

absl::StatusOr<std::string> RenderProgram(const std::vector<StmtPtr>& program,
                                          const ValueDict& context,
                                          const RenderSettings& settings) {
  Evaluator eval(context, settings);
  Flow flow = Flow::kNormal;
  RLMESH_RETURN_IF_ERROR(eval.Exec(program, &flow));
  return eval.TakeOutput();
}

}  // namespace rlmesh::actor::chat_template_internal
