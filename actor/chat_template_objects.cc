// Attribute and item access, methods and global functions. Lookups follow
// Jinja's sandboxed environment: `a.b` tries Python's attribute (a method of
// str/dict/list, a loop field) before the item, `a['b']` the item before the
// attribute, and a miss is Undefined rather than an error.

#include <algorithm>
#include <ctime>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actor/chat_template_builtins.h"
#include "actor/chat_template_text.h"

namespace rlmesh::actor::chat_template_internal {
namespace {

// Python's method names, so that `d.items` is the method (as in Jinja) even
// when the dict has a key "items". Only some are callable here; calling the
// others fails naming the method.
const char* const kStrMethods[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find",
    "format", "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
    "isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper",
    "join", "ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix",
    "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip",
    "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper",
    "zfill"};
const char* const kDictMethods[] = {"clear", "copy", "fromkeys", "get", "items", "keys",
                                    "pop", "popitem", "setdefault", "update", "values"};
const char* const kListMethods[] = {"append", "clear", "copy", "count", "extend", "index",
                                    "insert", "pop", "remove", "reverse", "sort"};
const char* const kGlobals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now",
                                "lipsum", "cycler", "joiner"};

// Jinja's sandbox refuses ranges longer than this.
constexpr int64_t kMaxRange = 100000;

template <size_t N>
bool In(const char* const (&names)[N], absl::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

Value Missing(const Value& obj, absl::string_view name) {
  return Value::Undefined(absl::StrCat("'", TypeName(obj), " object' has no attribute '", name, "'"));
}

// The argument at `pos`, or keyword `name`, or nullptr.
const Value* Arg(const CallArgs& args, size_t pos, absl::string_view name) {
  if (pos < args.positional.size()) return &args.positional[pos];
  for (const auto& [key, value] : args.keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

absl::Status CheckArity(const CallArgs& args, size_t max_positional, absl::string_view what) {
  if (args.positional.size() > max_positional) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " takes at most ", max_positional, " arguments"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> OptionalString(const Value* v, absl::string_view what) {
  if (v == nullptr || v->is_none()) return std::optional<std::string>();
  if (!v->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a string or None, not ", TypeName(*v)));
  }
  return std::optional<std::string>(v->str());
}

absl::StatusOr<int64_t> IntArg(const Value* v, int64_t fallback, absl::string_view what) {
  if (v == nullptr || v->is_none()) return fallback;
  if (!v->is_integral()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be an integer, not ", TypeName(*v)));
  }
  return v->as_int();
}

Value StringList(const std::vector<std::string>& parts) {
  ValueList out;
  for (const auto& p : parts) out.push_back(Value::String(p));
  return Value::List(std::move(out));
}

// str.startswith / str.endswith with a string or a tuple of strings.
absl::StatusOr<Value> AffixTest(const std::string& s, const CallArgs& args, bool prefix) {
  if (args.positional.size() != 1) {
    return absl::UnimplementedError("unsupported: startswith/endswith with start or end");
  }
  const Value& a = args.positional[0];
  std::vector<std::string> options;
  if (a.is_string()) {
    options.push_back(a.str());
  } else if (a.kind() == Value::Kind::kTuple) {
    for (const Value& v : a.items()) {
      if (!v.is_string()) return absl::InvalidArgumentError("startswith/endswith needs strings");
      options.push_back(v.str());
    }
  } else {
    return absl::InvalidArgumentError("startswith/endswith takes a string or a tuple of strings");
  }
  for (const auto& o : options) {
    if (prefix ? absl::StartsWith(s, o) : absl::EndsWith(s, o)) return Value::Bool(true);
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> CallStrMethod(const std::string& s, const std::string& name,
                                    const CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    RLMESH_RETURN_IF_ERROR(CheckArity(args, 1, name));
    RLMESH_ASSIGN_OR_RETURN(auto chars, OptionalString(Arg(args, 0, "chars"), "chars"));
    return Value::String(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    RLMESH_RETURN_IF_ERROR(CheckArity(args, 2, name));
    RLMESH_ASSIGN_OR_RETURN(auto sep, OptionalString(Arg(args, 0, "sep"), "sep"));
    RLMESH_ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(Arg(args, 1, "maxsplit"), -1, "maxsplit"));
    if (sep && sep->empty()) return absl::InvalidArgumentError("empty separator");
    return StringList(PySplit(s, sep, maxsplit, name == "rsplit"));
  }
  if (name == "startswith" || name == "endswith") return AffixTest(s, args, name == "startswith");
  if (name == "upper") return Value::String(PyUpper(s));
  if (name == "lower") return Value::String(PyLower(s));
  if (name == "title") return Value::String(PyTitle(s));
  if (name == "capitalize") return Value::String(PyCapitalize(s));
  if (name == "replace") {
    RLMESH_RETURN_IF_ERROR(CheckArity(args, 3, name));
    const Value* old = Arg(args, 0, "old");
    const Value* repl = Arg(args, 1, "new");
    if (old == nullptr || repl == nullptr || !old->is_string() || !repl->is_string()) {
      return absl::InvalidArgumentError("replace() takes two strings");
    }
    RLMESH_ASSIGN_OR_RETURN(int64_t count, IntArg(Arg(args, 2, "count"), -1, "count"));
    return Value::String(PyReplace(s, old->str(), repl->str(), count));
  }
  if (name == "find") {
    if (args.positional.size() != 1 || !args.positional[0].is_string()) {
      return absl::UnimplementedError("unsupported: str.find other than find(substring)");
    }
    return Value::Int(PyFind(s, args.positional[0].str()));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    if (args.positional.size() != 1 || !args.positional[0].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(name, "() takes one string"));
    }
    const std::string& a = args.positional[0].str();
    if (name == "removeprefix") return Value::String(absl::StartsWith(s, a) ? s.substr(a.size()) : s);
    return Value::String(absl::EndsWith(s, a) ? s.substr(0, s.size() - a.size()) : s);
  }
  if (name == "join") {
    if (args.positional.size() != 1) return absl::InvalidArgumentError("join() takes one iterable");
    RLMESH_ASSIGN_OR_RETURN(ValueList items, Iterate(args.positional[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence item ", i, ": expected str instance, ", TypeName(items[i]), " found"));
      }
      if (i > 0) out += s;
      out += items[i].str();
    }
    return Value::String(std::move(out));
  }
  return absl::UnimplementedError(absl::StrCat("unsupported method 'str.", name, "'"));
}

absl::StatusOr<Value> CallDictMethod(const Value& d, const std::string& name, const CallArgs& args) {
  if (name == "get") {
    if (args.positional.empty() || args.positional.size() > 2 || !args.keyword.empty()) {
      return absl::InvalidArgumentError("get() takes a key and an optional default");
    }
    const Value& key = args.positional[0];
    const Value* hit = key.is_string() ? d.Find(key.str()) : nullptr;
    if (hit != nullptr) return *hit;
    return args.positional.size() == 2 ? args.positional[1] : Value::None();
  }
  if (name == "items" || name == "keys" || name == "values") {
    if (!args.positional.empty() || !args.keyword.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name, "() takes no arguments"));
    }
    ValueList out;
    for (const auto& [key, value] : d.dict()) {
      if (name == "items") {
        out.push_back(Value::Tuple({Value::String(key), value}));
      } else {
        out.push_back(name == "keys" ? Value::String(key) : value);
      }
    }
    return Value::List(std::move(out));
  }
  return absl::UnimplementedError(absl::StrCat("unsupported method 'dict.", name, "'"));
}

absl::StatusOr<Value> Range(const CallArgs& args) {
  if (args.positional.empty() || args.positional.size() > 3 || !args.keyword.empty()) {
    return absl::InvalidArgumentError("range() takes 1 to 3 integer arguments");
  }
  int64_t bounds[3] = {0, 0, 1};
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (!args.positional[i].is_integral()) {
      return absl::InvalidArgumentError(absl::StrCat("range() needs integers, not ",
                                                     TypeName(args.positional[i])));
    }
  }
  if (args.positional.size() == 1) {
    bounds[1] = args.positional[0].as_int();
  } else {
    for (size_t i = 0; i < args.positional.size(); ++i) bounds[i] = args.positional[i].as_int();
  }
  const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
  if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
  const long double span = step > 0 ? static_cast<long double>(stop) - start
                                    : static_cast<long double>(start) - stop;
  const long double count = span <= 0 ? 0 : (span + (step > 0 ? step : -step) - 1) / (step > 0 ? step : -step);
  if (count > kMaxRange) {
    return absl::ResourceExhaustedError(
        absl::StrCat("range too big: the sandbox allows at most ", kMaxRange, " items"));
  }
  ValueList out;
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.push_back(Value::Int(start + i * step));
  return Value::List(std::move(out));
}

// A dict from an optional mapping argument plus keyword arguments.
absl::StatusOr<ValueDict> MappingArgs(const CallArgs& args, absl::string_view what) {
  ValueDict out;
  if (args.positional.size() > 1 || (args.positional.size() == 1 && !args.positional[0].is_dict())) {
    return absl::InvalidArgumentError(absl::StrCat(what, "() takes one optional mapping"));
  }
  if (!args.positional.empty()) out = args.positional[0].dict();
  for (const auto& arg : args.keyword) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang refuses).
    const auto& key = arg.first;
    const auto& value = arg.second;
    auto same = std::find_if(out.begin(), out.end(), [&](const auto& kv) { return kv.first == key; });
    if (same != out.end()) {
      same->second = value;
    } else {
      out.emplace_back(key, value);
    }
  }
  return out;
}

// datetime.now().strftime(fmt): Python fills %f, %z and %Z itself (empty
// offsets for its naive local time) and hands the rest to C's strftime.
absl::StatusOr<Value> StrftimeNow(const CallArgs& args, const BuiltinEnv& env) {
  if (args.positional.size() != 1 || !args.positional[0].is_string()) {
    return absl::InvalidArgumentError("strftime_now() takes one format string");
  }
  const absl::Time now = env.clock ? env.clock() : absl::Now();
  const absl::TimeZone::CivilInfo ci = env.time_zone.At(now);
  std::tm tm{};
  tm.tm_year = static_cast<int>(ci.cs.year() - 1900);
  tm.tm_mon = ci.cs.month() - 1;
  tm.tm_mday = ci.cs.day();
  tm.tm_hour = ci.cs.hour();
  tm.tm_min = ci.cs.minute();
  tm.tm_sec = ci.cs.second();
  tm.tm_wday = (static_cast<int>(absl::GetWeekday(ci.cs)) + 1) % 7;  // absl: Monday is 0
  tm.tm_yday = absl::GetYearDay(ci.cs) - 1;
  tm.tm_isdst = -1;
  const std::string& fmt = args.positional[0].str();
  std::string pre;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%' || i + 1 >= fmt.size()) {
      pre.push_back(fmt[i]);
      continue;
    }
    const char c = fmt[++i];
    if (c == 'f') {
      pre += absl::StrFormat("%06d", ci.subsecond / absl::Microseconds(1));
    } else if (c != 'z' && c != 'Z') {
      pre.push_back('%');
      pre.push_back(c);
    }
  }
  if (pre.empty()) return Value::String("");
  for (size_t size = 256; size <= 1024 * (pre.size() + 1); size *= 4) {
    std::string buf(size, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), pre.c_str(), &tm);
    if (n > 0) {
      buf.resize(n);
      if (!IsValidUtf8(buf)) return absl::InvalidArgumentError("strftime_now produced invalid UTF-8");
      return Value::String(std::move(buf));
    }
  }
  return Value::String("");
}

absl::StatusOr<Value> CallGlobal(const std::string& name, const CallArgs& args,
                                 const BuiltinEnv& env) {
  if (name == "range") return Range(args);
  if (name == "raise_exception") {
    const Value* msg = Arg(args, 0, "message");
    return absl::InvalidArgumentError(
        absl::StrCat("raise_exception: ", msg == nullptr ? "" : Str(*msg)));
  }
  if (name == "strftime_now") return StrftimeNow(args, env);
  if (name == "namespace" || name == "dict") {
    RLMESH_ASSIGN_OR_RETURN(ValueDict attrs, MappingArgs(args, name));
    if (name == "dict") return Value::Dict(std::move(attrs));
    for (const auto& [key, value] : attrs) {
      if (!key.empty() && key[0] == '_') {
        return absl::InvalidArgumentError("namespace attributes may not start with '_'");
      }
      if (value.holds_reference()) {
        return absl::UnimplementedError("unsupported: a namespace, loop or function in a namespace");
      }
    }
    auto ns = std::make_shared<Namespace>();
    ns->attrs = std::move(attrs);
    return Value::Ns(std::move(ns));
  }
  return absl::UnimplementedError(absl::StrCat("unsupported function '", name, "'"));
}

Value LoopField(const Value& loop, absl::string_view name) {
  const LoopState& s = loop.loop();
  const int64_t i = s.index0;
  const int64_t n = static_cast<int64_t>(s.items->size());
  if (name == "index") return Value::Int(i + 1);
  if (name == "index0") return Value::Int(i);
  if (name == "revindex") return Value::Int(n - i);
  if (name == "revindex0") return Value::Int(n - i - 1);
  if (name == "first") return Value::Bool(i == 0);
  if (name == "last") return Value::Bool(i == n - 1);
  if (name == "length") return Value::Int(n);
  if (name == "depth") return Value::Int(1);
  if (name == "depth0") return Value::Int(0);
  if (name == "previtem") {
    return i > 0 ? (*s.items)[i - 1] : Value::Undefined("there is no previous item");
  }
  if (name == "nextitem") {
    return i + 1 < n ? (*s.items)[i + 1] : Value::Undefined("there is no next item");
  }
  if (name == "cycle") return Value::Callable("cycle", loop);
  return Missing(loop, name);
}

absl::StatusOr<int64_t> SliceBound(const Value& v) {
  if (!v.is_integral()) {
    return absl::InvalidArgumentError("slice indices must be integers or None");
  }
  return v.as_int();
}

}  // namespace

absl::Status UndefinedError(const Value& undefined) {
  return absl::InvalidArgumentError(undefined.str().empty() ? "use of an undefined value"
                                                            : undefined.str());
}

absl::StatusOr<ValueList> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return ValueList();
    case Value::Kind::kList:
    case Value::Kind::kTuple: return v.items();
    case Value::Kind::kGenerator:
      RLMESH_RETURN_IF_ERROR(v.generator_error());
      return v.items();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& kv : v.dict()) keys.push_back(Value::String(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (char32_t c : DecodeUtf8(v.str())) {
        std::string s;
        AppendUtf8(c, &s);
        chars.push_back(Value::String(std::move(s)));
      }
      return chars;
    }
    case Value::Kind::kLoop: return *v.loop().items;
    default:
      return absl::InvalidArgumentError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<Value> GetAttr(const Value& obj, absl::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: return UndefinedError(obj);
    case Value::Kind::kDict: {
      if (In(kDictMethods, name)) return Value::Callable(std::string(name), obj);
      const Value* hit = obj.Find(name);
      return hit != nullptr ? *hit : Missing(obj, name);
    }
    case Value::Kind::kString:
      return In(kStrMethods, name) ? Value::Callable(std::string(name), obj) : Missing(obj, name);
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return In(kListMethods, name) ? Value::Callable(std::string(name), obj) : Missing(obj, name);
    case Value::Kind::kNamespace:
      for (const auto& kv : obj.ns().attrs) {
        if (kv.first == name) return kv.second;
      }
      return Missing(obj, name);
    case Value::Kind::kLoop: return LoopField(obj, name);
    default: return Missing(obj, name);
  }
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict() && key.is_string()) {
    const Value* hit = obj.Find(key.str());
    if (hit != nullptr) return *hit;
  } else if ((obj.is_sequence() || obj.is_string()) && key.is_integral()) {
    int64_t i = key.as_int();
    if (obj.is_string()) {
      const std::u32string u = DecodeUtf8(obj.str());
      const int64_t n = static_cast<int64_t>(u.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::Undefined("string index out of range");
      std::string c;
      AppendUtf8(u[i], &c);
      return Value::String(std::move(c));
    }
    const int64_t n = static_cast<int64_t>(obj.items().size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::Undefined(absl::StrCat(TypeName(obj), " index out of range"));
    return obj.items()[i];
  }
  if (key.is_string()) {
    RLMESH_ASSIGN_OR_RETURN(Value attr, GetAttr(obj, key.str()));
    if (!attr.is_undefined()) return attr;
  }
  return Value::Undefined(absl::StrCat("'", TypeName(obj), " object' has no attribute ", Repr(key)));
}

absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step) {
  // Jinja compiles a slice to a plain Python subscript, not to its forgiving
  // getitem: slicing anything but a sequence or string fails.
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict()) return absl::InvalidArgumentError("unhashable type: 'slice'");
  if (!obj.is_sequence() && !obj.is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  auto given = [](const Value& v) { return !v.is_none(); };
  int64_t st = 1;
  if (given(step)) {
    RLMESH_ASSIGN_OR_RETURN(st, SliceBound(step));
  }
  if (st == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  std::u32string chars;
  if (obj.is_string()) chars = DecodeUtf8(obj.str());
  const int64_t n = obj.is_string() ? static_cast<int64_t>(chars.size())
                                    : static_cast<int64_t>(obj.items().size());
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t dflt) -> absl::StatusOr<int64_t> {
    if (!given(v)) return dflt;
    RLMESH_ASSIGN_OR_RETURN(int64_t i, SliceBound(v));
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  RLMESH_ASSIGN_OR_RETURN(int64_t b, adjust(start, st > 0 ? 0 : n - 1));
  RLMESH_ASSIGN_OR_RETURN(int64_t e, adjust(stop, st > 0 ? n : -1));
  std::u32string s;
  ValueList items;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_string()) {
      s.push_back(chars[i]);
    } else {
      items.push_back(obj.items()[i]);
    }
  }
  if (obj.is_string()) return Value::String(EncodeUtf8(s));
  return obj.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
}

Value LookupGlobal(absl::string_view name) {
  return In(kGlobals, name) ? Value::Callable(std::string(name), Value()) : Value();
}

absl::StatusOr<Value> CallValue(const Value& callee, const CallArgs& args, const BuiltinEnv& env) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (callee.kind() != Value::Kind::kCallable) {
    return absl::InvalidArgumentError(absl::StrCat("'", TypeName(callee), "' object is not callable"));
  }
  const Value& self = callee.receiver();
  const std::string& name = callee.str();
  switch (self.kind()) {
    case Value::Kind::kUndefined: return CallGlobal(name, args, env);
    case Value::Kind::kString: return CallStrMethod(self.str(), name, args);
    case Value::Kind::kDict: return CallDictMethod(self, name, args);
    case Value::Kind::kLoop: {
      if (args.positional.empty()) return absl::InvalidArgumentError("loop.cycle() needs arguments");
      return args.positional[self.loop().index0 % static_cast<int64_t>(args.positional.size())];
    }
    default:
      return absl::UnimplementedError(
          absl::StrCat("unsupported method '", TypeName(self), ".", name, "'"));
  }
}

}  // namespace rlmesh::actor::chat_template_internal
