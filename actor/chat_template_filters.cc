// Jinja's filters and tests that chat templates use, with Jinja's argument
// order and defaults. `tojson` is transformers' override: json.dumps with
// ensure_ascii=False and the indent/separators/sort_keys it passes through.

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "actor/chat_template_builtins.h"
#include "actor/chat_template_text.h"

namespace rlmesh::actor::chat_template_internal {
namespace {

const char* const kFilters[] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "first", "float", "int",
    "items", "join", "last", "length", "list", "lower", "map", "reject", "rejectattr",
    "replace", "reverse", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "upper"};
const char* const kTests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "even", "false",
    "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le", "<=",
    "lower", "lt", "lessthan", "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas",
    "sequence", "string", "true", "undefined", "upper"};

template <size_t N>
bool In(const char* const (&names)[N], absl::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

const Value* Arg(const CallArgs& args, size_t pos, absl::string_view name) {
  if (pos < args.positional.size()) return &args.positional[pos];
  for (const auto& [key, value] : args.keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

bool BoolArg(const CallArgs& args, size_t pos, absl::string_view name) {
  const Value* v = Arg(args, pos, name);
  return v != nullptr && Truthy(*v);
}

// Rejects keyword arguments a filter does not take, naming them.
absl::Status CheckKeywords(const CallArgs& args, absl::string_view filter,
                           std::initializer_list<absl::string_view> allowed) {
  for (const auto& kv : args.keyword) {
    if (std::find(allowed.begin(), allowed.end(), kv.first) == allowed.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("filter '", filter, "' got an unexpected keyword argument '", kv.first, "'"));
    }
  }
  return absl::OkStatus();
}

// Jinja's attribute paths ("a.b", "items.0"): each part is an item lookup.
absl::StatusOr<Value> AttrPath(const Value& item, absl::string_view path) {
  Value cur = item;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    int64_t index = 0;
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), absl::ascii_isdigit) &&
                         absl::SimpleAtoi(part, &index);
    RLMESH_ASSIGN_OR_RETURN(cur, GetItem(cur, numeric ? Value::Int(index) : Value::String(std::string(part))));
  }
  return cur;
}

absl::StatusOr<Value> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return Value::Int(0);
    case Value::Kind::kString: return Value::Int(CodePointCount(v.str()));
    case Value::Kind::kList:
    case Value::Kind::kTuple: return Value::Int(static_cast<int64_t>(v.items().size()));
    case Value::Kind::kDict: return Value::Int(static_cast<int64_t>(v.dict().size()));
    case Value::Kind::kLoop: return Value::Int(static_cast<int64_t>(v.loop().items->size()));
    default:
      return absl::InvalidArgumentError(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
  }
}

// Python's float(str): surrounding whitespace, underscores between digits,
// inf/nan spelled any case.
bool ParsePyFloat(const std::string& text, double* out) {
  std::string s = PyStrip(text, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !absl::ascii_isdigit(s[i - 1]) || !absl::ascii_isdigit(s[i + 1])) {
        return false;
      }
      continue;
    }
    clean.push_back(s[i]);
  }
  if (clean.empty() || clean.find_first_of("xXpP") != std::string::npos) return false;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end == clean.c_str() + clean.size();
}

// Jinja's `int` filter: int(s, base) for strings, else int(value), then
// int(float(value)), else the default.
absl::StatusOr<Value> ToInt(const Value& v, const CallArgs& args) {
  const Value* dflt = Arg(args, 0, "default");
  const Value fallback = dflt != nullptr ? *dflt : Value::Int(0);
  const Value* base_arg = Arg(args, 1, "base");
  const int64_t base = base_arg != nullptr && base_arg->is_integral() ? base_arg->as_int() : 10;
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) return Value::Int(v.as_int());
  if (v.kind() == Value::Kind::kFloat) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value::Int(static_cast<int64_t>(d));
  }
  if (!v.is_string()) return fallback;
  std::string s = PyStrip(v.str(), std::nullopt, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  int b = static_cast<int>(base);
  std::string digits = s;
  bool negative = false;
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) {
    negative = digits[0] == '-';
    digits.erase(0, 1);
  }
  if (digits.size() > 2 && digits[0] == '0') {
    const char p = absl::ascii_tolower(digits[1]);
    const int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed != 0 && (b == 0 || b == prefixed)) {
      b = prefixed;
      digits.erase(0, 2);
    }
  }
  if (b == 0) b = 10;
  if (!digits.empty() && b >= 2 && b <= 36 && absl::ascii_isalnum(digits[0])) {
    errno = 0;
    char* end = nullptr;
    const long long parsed = std::strtoll(digits.c_str(), &end, b);
    if (errno == 0 && end == digits.c_str() + digits.size()) return Value::Int(negative ? -parsed : parsed);
  }
  double d = 0;
  if (ParsePyFloat(v.str(), &d) && std::isfinite(d) && std::fabs(d) < 9.2e18) {
    return Value::Int(static_cast<int64_t>(d));
  }
  return fallback;
}

absl::StatusOr<Value> ToJsonFilter(const Value& v, const CallArgs& args) {
  RLMESH_RETURN_IF_ERROR(CheckKeywords(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions o;
  o.ensure_ascii = BoolArg(args, 0, "ensure_ascii");
  o.sort_keys = BoolArg(args, 3, "sort_keys");
  const Value* indent = Arg(args, 1, "indent");
  if (indent != nullptr && !indent->is_none()) {
    if (indent->is_string()) {
      o.indent = indent->str();
    } else if (indent->is_integral()) {
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent->as_int(), 1024))), ' ');
    } else {
      return absl::InvalidArgumentError("tojson: indent must be an integer or a string");
    }
    o.item_separator = ",";
  }
  const Value* seps = Arg(args, 2, "separators");
  if (seps != nullptr && !seps->is_none()) {
    if (!seps->is_sequence() || seps->items().size() != 2 || !seps->items()[0].is_string() ||
        !seps->items()[1].is_string()) {
      return absl::InvalidArgumentError("tojson: separators must be a pair of strings");
    }
    o.item_separator = seps->items()[0].str();
    o.key_separator = seps->items()[1].str();
  }
  RLMESH_ASSIGN_OR_RETURN(std::string text, ToJson(v, o));
  return Value::String(std::move(text));
}

// select/reject/selectattr/rejectattr: keep items whose (attribute's) test
// result is `keep`; with no test named, truthiness decides.
absl::StatusOr<Value> SelectFilter(const Value& v, const CallArgs& args, bool by_attr, bool keep) {
  RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  if (items.empty()) return Value::Generator({});  // Jinja checks arguments per item
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return absl::InvalidArgumentError("selectattr/rejectattr need an attribute name");
    }
    attr = args.positional[0].str();
    next = 1;
  }
  std::string test;
  CallArgs test_args;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return absl::InvalidArgumentError("the test name must be a string");
    test = args.positional[next].str();
    if (!IsKnownTest(test)) return absl::UnimplementedError(absl::StrCat("unsupported test '", test, "'"));
    test_args.positional.assign(args.positional.begin() + next + 1, args.positional.end());
    test_args.keyword = args.keyword;
  }
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      RLMESH_ASSIGN_OR_RETURN(subject, AttrPath(item, attr));
    }
    bool pass = false;
    if (test.empty()) {
      pass = Truthy(subject);
    } else {
      RLMESH_ASSIGN_OR_RETURN(pass, ApplyTest(test, subject, test_args));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> MapFilter(const Value& v, const CallArgs& args, const BuiltinEnv& env) {
  RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  if (items.empty()) return Value::Generator({});  // Jinja checks arguments per item
  ValueList out;
  const Value* attribute = args.positional.empty() ? Arg(args, SIZE_MAX, "attribute") : nullptr;
  if (attribute != nullptr) {
    RLMESH_RETURN_IF_ERROR(CheckKeywords(args, "map", {"attribute", "default"}));
    if (!attribute->is_string()) return absl::InvalidArgumentError("map: attribute must be a string");
    const Value* dflt = Arg(args, SIZE_MAX, "default");
    for (const Value& item : items) {
      RLMESH_ASSIGN_OR_RETURN(Value got, AttrPath(item, attribute->str()));
      out.push_back(got.is_undefined() && dflt != nullptr ? *dflt : got);
    }
    return Value::Generator(std::move(out));
  }
  if (args.positional.empty()) return absl::InvalidArgumentError("map requires a filter argument");
  if (!args.positional[0].is_string()) return absl::InvalidArgumentError("map: the filter name must be a string");
  const std::string& filter = args.positional[0].str();
  if (!IsKnownFilter(filter)) return absl::UnimplementedError(absl::StrCat("unsupported filter '", filter, "'"));
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    RLMESH_ASSIGN_OR_RETURN(Value mapped, ApplyFilter(filter, item, rest, env));
    out.push_back(std::move(mapped));
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> SortFilter(const Value& v, const CallArgs& args) {
  RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
  const bool reverse = BoolArg(args, 0, "reverse");
  const bool case_sensitive = BoolArg(args, 1, "case_sensitive");
  const Value* attribute = Arg(args, 2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;  // (sort key, item)
  for (const Value& item : items) {
    Value key = item;
    if (attribute != nullptr && attribute->is_string()) {
      RLMESH_ASSIGN_OR_RETURN(key, AttrPath(item, attribute->str()));
    }
    if (!case_sensitive && key.is_string()) key = Value::String(PyLower(key.str()));
    keyed.emplace_back(std::move(key), item);
  }
  absl::Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto c = reverse ? Compare(b.first, a.first) : Compare(a.first, b.first);
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return *c < 0;
  });
  RLMESH_RETURN_IF_ERROR(error);
  ValueList out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> DictSort(const Value& v, const CallArgs& args) {
  if (!v.is_dict()) return absl::InvalidArgumentError("dictsort needs a mapping");
  const bool case_sensitive = BoolArg(args, 0, "case_sensitive");
  const Value* by = Arg(args, 1, "by");
  const bool by_value = by != nullptr && by->is_string() && by->str() == "value";
  const bool reverse = BoolArg(args, 2, "reverse");
  ValueList pairs;
  for (const auto& [key, value] : v.dict()) pairs.push_back(Value::Tuple({Value::String(key), value}));
  CallArgs sort_args;
  sort_args.keyword = {{"reverse", Value::Bool(reverse)},
                       {"case_sensitive", Value::Bool(case_sensitive)},
                       {"attribute", Value::String(by_value ? "1" : "0")}};
  return SortFilter(Value::List(std::move(pairs)), sort_args);
}

}  // namespace

// The arguments each filter takes after its subject (Python rejects others);
// map and the select family pass theirs on and are not listed.
struct Signature {
  const char* name;
  size_t max_positional;
  std::initializer_list<absl::string_view> keywords;
};
const Signature kSignatures[] = {
    {"abs", 0, {}}, {"capitalize", 0, {}}, {"count", 0, {}}, {"length", 0, {}},
    {"d", 2, {"default_value", "boolean"}}, {"default", 2, {"default_value", "boolean"}},
    {"dictsort", 3, {"case_sensitive", "by", "reverse"}}, {"first", 0, {}}, {"last", 0, {}},
    {"float", 1, {"default"}}, {"int", 2, {"default", "base"}}, {"items", 0, {}},
    {"join", 2, {"d", "attribute"}}, {"list", 0, {}}, {"lower", 0, {}}, {"upper", 0, {}},
    {"replace", 3, {"old", "new", "count"}}, {"reverse", 0, {}}, {"safe", 0, {}},
    {"sort", 3, {"reverse", "case_sensitive", "attribute"}}, {"string", 0, {}},
    {"sum", 2, {"attribute", "start"}}, {"title", 0, {}},
    {"tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"}}, {"trim", 1, {"chars"}}};

absl::Status CheckSignature(absl::string_view name, const CallArgs& args) {
  for (const Signature& sig : kSignatures) {
    if (name != sig.name) continue;
    if (args.positional.size() > sig.max_positional) {
      return absl::InvalidArgumentError(absl::StrCat("filter '", name, "' takes at most ",
                                                     sig.max_positional, " arguments, got ",
                                                     args.positional.size()));
    }
    return CheckKeywords(args, name, sig.keywords);
  }
  return absl::OkStatus();
}

bool IsKnownFilter(absl::string_view name) { return In(kFilters, name); }
bool IsKnownTest(absl::string_view name) { return In(kTests, name); }

// Long because: one branch per built-in filter, each a few lines (the longer filters have functions
// of their own).
absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& v, const CallArgs& args,
                                  const BuiltinEnv& env) {
  RLMESH_RETURN_IF_ERROR(CheckSignature(name, args));
  if (name == "length" || name == "count") return Length(v);
  if (name == "string") return Value::String(Str(v));
  if (name == "safe") return v;
  if (name == "lower") return Value::String(PyLower(Str(v)));
  if (name == "upper") return Value::String(PyUpper(Str(v)));
  if (name == "capitalize") return Value::String(PyCapitalize(Str(v)));
  if (name == "title") return Value::String(JinjaTitle(Str(v)));
  if (name == "trim") {
    const Value* chars = Arg(args, 0, "chars");
    std::optional<std::string> set;
    if (chars != nullptr && !chars->is_none()) set = Str(*chars);
    return Value::String(PyStrip(Str(v), set, true, true));
  }
  if (name == "tojson") return ToJsonFilter(v, args);
  if (name == "default" || name == "d") {
    const Value* dflt = Arg(args, 0, "default_value");
    if (v.is_undefined() || (BoolArg(args, 1, "boolean") && !Truthy(v))) {
      return dflt != nullptr ? *dflt : Value::String("");
    }
    return v;
  }
  if (name == "first" || name == "last") {
    if (name == "last" && v.kind() == Value::Kind::kGenerator) {
      return absl::InvalidArgumentError("'generator' object is not reversible");
    }
    RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    if (items.empty()) return Value::Undefined(absl::StrCat("no ", name, " item, sequence was empty"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    return Value::List(std::move(items));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::Generator({});
    if (!v.is_dict()) {  // a generator in Jinja: fails when consumed
      return Value::FailedGenerator(
          absl::InvalidArgumentError("items: can only get item pairs from a mapping"));
    }
    ValueList out;
    for (const auto& [key, value] : v.dict()) out.push_back(Value::Tuple({Value::String(key), value}));
    return Value::Generator(std::move(out));
  }
  if (name == "join") {
    RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    const Value* sep = Arg(args, 0, "d");
    const Value* attribute = Arg(args, 1, "attribute");
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0 && sep != nullptr) out += Str(*sep);
      Value item = items[i];
      if (attribute != nullptr && !attribute->is_none()) {
        RLMESH_ASSIGN_OR_RETURN(item, AttrPath(item, Str(*attribute)));
      }
      out += Str(item);
      if (static_cast<int64_t>(out.size()) > env.max_string_bytes) {
        return absl::ResourceExhaustedError("join: the string exceeds the output limit");
      }
    }
    return Value::String(std::move(out));
  }
  if (name == "replace") {
    const Value* old = Arg(args, 0, "old");
    const Value* repl = Arg(args, 1, "new");
    if (old == nullptr || repl == nullptr) return absl::InvalidArgumentError("replace needs old and new");
    const Value* count = Arg(args, 2, "count");
    const int64_t n = count != nullptr && count->is_integral() ? count->as_int() : -1;
    const std::string s = Str(v), o = Str(*old), r = Str(*repl);
    if (r.size() > o.size() && static_cast<int64_t>(s.size() / std::max<size_t>(o.size(), 1) * r.size()) >
                                   env.max_string_bytes) {
      return absl::ResourceExhaustedError("replace: the string exceeds the output limit");
    }
    return Value::String(PyReplace(s, o, r, n));
  }
  if (name == "int") return ToInt(v, args);
  if (name == "float") {
    const Value* dflt = Arg(args, 0, "default");
    const Value fallback = dflt != nullptr ? *dflt : Value::Float(0.0);
    if (v.is_undefined()) return UndefinedError(v);
    if (v.is_number()) return Value::Float(v.as_double());
    double d = 0;
    if (v.is_string() && ParsePyFloat(v.str(), &d)) return Value::Float(d);
    return fallback;
  }
  if (name == "abs") {
    if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.as_double()));
    if (v.is_integral() && v.as_int() != INT64_MIN) return Value::Int(std::llabs(v.as_int()));
    return absl::InvalidArgumentError(absl::StrCat("bad operand type for abs(): '", TypeName(v), "'"));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = DecodeUtf8(v.str());
      std::reverse(u.begin(), u.end());
      return Value::String(EncodeUtf8(u));
    }
    if (v.kind() == Value::Kind::kGenerator) {
      return absl::InvalidArgumentError("'generator' object is not reversible");
    }
    RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::Generator(std::move(items));  // Python's reverse iterator
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr" ||
      name == "map") {
    // Jinja's are generators: nothing runs, and nothing fails, until consumed,
    // and a false input (None, empty, undefined) yields nothing at all.
    if (!Truthy(v)) return Value::Generator({});
    auto out = name == "map" ? MapFilter(v, args, env)
                             : SelectFilter(v, args, absl::EndsWith(name, "attr"),
                                            absl::StartsWith(name, "select"));
    return out.ok() ? *out : Value::FailedGenerator(out.status());
  }
  if (name == "sort") return SortFilter(v, args);
  if (name == "dictsort") return DictSort(v, args);
  if (name == "sum") {
    RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    const Value* attribute = Arg(args, 0, "attribute");
    const Value* start = Arg(args, 1, "start");
    Value total = start != nullptr ? *start : Value::Int(0);
    for (const Value& item : items) {
      Value x = item;
      if (attribute != nullptr && !attribute->is_none()) {
        RLMESH_ASSIGN_OR_RETURN(x, AttrPath(item, Str(*attribute)));
      }
      if (!x.is_number() || !total.is_number()) return absl::InvalidArgumentError("sum needs numbers");
      int64_t r = 0;
      if (x.is_integral() && total.is_integral() && !__builtin_add_overflow(total.as_int(), x.as_int(), &r)) {
        total = Value::Int(r);
      } else {
        total = Value::Float(total.as_double() + x.as_double());
      }
    }
    return total;
  }
  return absl::UnimplementedError(absl::StrCat("unsupported filter '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, const CallArgs& args) {
  using K = Value::Kind;
  static const char* const kNoArgument[] = {
      "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number",
      "string", "mapping", "callable", "iterable", "sequence", "lower", "upper", "even", "odd"};
  const size_t given = args.positional.size() + args.keyword.size();
  const size_t wanted = In(kNoArgument, name) ? 0 : 1;
  if (given != wanted) {
    return absl::InvalidArgumentError(
        absl::StrCat("test '", name, "' takes ", wanted, " argument(s), got ", given));
  }
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == K::kBool;
  if (name == "true") return v.kind() == K::kBool && v.as_bool();
  if (name == "false") return v.kind() == K::kBool && !v.as_bool();
  if (name == "integer") return v.kind() == K::kInt;
  if (name == "float") return v.kind() == K::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "callable") return v.kind() == K::kCallable;
  if (name == "iterable" || name == "sequence") {
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() ||
           (name == "iterable" && (v.kind() == K::kLoop || v.kind() == K::kGenerator));
  }
  if (name == "lower" || name == "upper") {
    const std::string s = Str(v);
    const std::string lower = PyLower(s), upper = PyUpper(s);
    return name == "lower" ? (s == lower && s != upper) : (s == upper && s != lower);
  }
  const Value* other = Arg(args, 0, "value");
  if (name == "even" || name == "odd") {
    if (!v.is_number()) return absl::InvalidArgumentError(absl::StrCat(name, " needs a number"));
    const bool even = v.is_integral() ? v.as_int() % 2 == 0 : std::fmod(v.as_double(), 2.0) == 0;
    return name == "even" ? even : !even;
  }
  if (other == nullptr) return absl::InvalidArgumentError(absl::StrCat("test '", name, "' needs an argument"));
  if (name == "divisibleby") {
    if (!v.is_number() || !other->is_number()) return absl::InvalidArgumentError("divisibleby needs numbers");
    if (other->as_double() == 0) return absl::InvalidArgumentError("divisibleby: division by zero");
    if (v.is_integral() && other->is_integral()) return v.as_int() % other->as_int() == 0;
    return std::fmod(v.as_double(), other->as_double()) == 0;
  }
  if (name == "sameas") {
    // Identity: exact for None and booleans, and Python's cached small ints.
    if (v.kind() != other->kind()) return false;
    if (v.is_none() || v.kind() == K::kBool) return Equals(v, *other);
    if (v.kind() == K::kInt) return v.as_int() == other->as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    if (v.kind() == K::kNamespace || v.kind() == K::kLoop) return Equals(v, *other);
    return false;
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equals(v, *other);
  if (name == "ne" || name == "!=") return !Equals(v, *other);
  if (name == "in") {
    if (other->is_string()) {
      if (!v.is_string()) return absl::InvalidArgumentError("'in <string>' requires string as left operand");
      return other->str().find(v.str()) != std::string::npos;
    }
    RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(*other));
    if (other->is_dict()) return v.is_string() && other->Find(v.str()) != nullptr;
    for (const Value& x : items) {
      if (Equals(x, v)) return true;
    }
    return false;
  }
  if (v.is_undefined()) return UndefinedError(v);
  if (other->is_undefined()) return UndefinedError(*other);
  RLMESH_ASSIGN_OR_RETURN(int c, Compare(v, *other));
  if (name == "lt" || name == "lessthan" || name == "<") return c < 0;
  if (name == "le" || name == "<=") return c <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return c > 0;
  if (name == "ge" || name == ">=") return c >= 0;
  return absl::UnimplementedError(absl::StrCat("unsupported test '", name, "'"));
}

}  // namespace rlmesh::actor::chat_template_internal
