#include "actor/chat_template_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actor/chat_template_text.h"

namespace rlmesh::actor::chat_template_internal {
namespace {

const std::string& EmptyString() {
  static const std::string* const kEmpty = new std::string();
  return *kEmpty;
}

template <typename T>
void NoteChild(const Value& child, T* payload) {
  payload->depth = std::max(payload->depth, child.depth() + 1);
  payload->holds_reference |= child.holds_reference();
}

void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (char32_t c : DecodeUtf8(s)) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
          if (c > 0xFFFF) {  // a surrogate pair, as Python writes it
            const char32_t v = c - 0x10000;
            *out += absl::StrFormat("\\u%04x\\u%04x", static_cast<uint32_t>(0xD800 + (v >> 10)),
                                    static_cast<uint32_t>(0xDC00 + (v & 0x3FF)));
          } else {
            *out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
          }
        } else {
          AppendUtf8(c, out);
        }
    }
  }
  out->push_back('"');
}

absl::Status DumpJson(const Value& v, const JsonDumpOptions& o, int level, std::string* out) {
  using K = Value::Kind;
  switch (v.kind()) {
    case K::kNone: *out += "null"; return absl::OkStatus();
    case K::kBool: *out += v.as_bool() ? "true" : "false"; return absl::OkStatus();
    case K::kInt: *out += absl::StrCat(v.as_int()); return absl::OkStatus();
    case K::kFloat: {
      const double d = v.as_double();
      *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                                                    : PyFloatRepr(d);
      return absl::OkStatus();
    }
    case K::kString: AppendJsonString(v.str(), o.ensure_ascii, out); return absl::OkStatus();
    case K::kList:
    case K::kTuple:
    case K::kDict: {
      const bool is_dict = v.is_dict();
      const size_t n = is_dict ? v.dict().size() : v.items().size();
      if (n == 0) {
        *out += is_dict ? "{}" : "[]";
        return absl::OkStatus();
      }
      out->push_back(is_dict ? '{' : '[');
      std::string newline_indent;
      if (o.indent) {
        newline_indent = "\n";
        for (int i = 0; i <= level; ++i) newline_indent += *o.indent;
        *out += newline_indent;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      if (is_dict) {
        for (const auto& kv : v.dict()) entries.push_back(&kv);
        if (o.sort_keys) {
          std::stable_sort(entries.begin(), entries.end(),
                           [](auto* a, auto* b) { return a->first < b->first; });
        }
      }
      for (size_t i = 0; i < n; ++i) {
        if (i > 0) *out += o.item_separator + newline_indent;
        if (is_dict) {
          AppendJsonString(entries[i]->first, o.ensure_ascii, out);
          *out += o.key_separator;
          RLMESH_RETURN_IF_ERROR(DumpJson(entries[i]->second, o, level + 1, out));
        } else {
          RLMESH_RETURN_IF_ERROR(DumpJson(v.items()[i], o, level + 1, out));
        }
      }
      if (o.indent) {
        *out += "\n";
        for (int i = 0; i < level; ++i) *out += *o.indent;
      }
      out->push_back(is_dict ? '}' : ']');
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: object of type ", TypeName(v), " is not JSON serializable"));
  }
}

absl::StatusOr<Value> FromJsonAt(const nlohmann::ordered_json& j, int depth) {
  using J = nlohmann::ordered_json::value_t;
  if (depth > kMaxValueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template input nests deeper than ", kMaxValueDepth, " levels"));
  }
  switch (j.type()) {
    case J::null: return Value::None();
    case J::boolean: return Value::Bool(j.get<bool>());
    case J::number_integer: return Value::Int(j.get<int64_t>());
    case J::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return absl::InvalidArgumentError(
            absl::StrCat("chat template input integer ", u, " does not fit in int64"));
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case J::number_float: return Value::Float(j.get<double>());
    case J::string: {
      const auto& s = j.get_ref<const std::string&>();
      if (!IsValidUtf8(s)) return absl::InvalidArgumentError("chat template input string is not UTF-8");
      return Value::String(s);
    }
    case J::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) {
        RLMESH_ASSIGN_OR_RETURN(Value v, FromJsonAt(e, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case J::object: {
      ValueDict items;
      items.reserve(j.size());
      for (const auto& [key, e] : j.items()) {
        if (!IsValidUtf8(key)) return absl::InvalidArgumentError("chat template input key is not UTF-8");
        RLMESH_ASSIGN_OR_RETURN(Value v, FromJsonAt(e, depth + 1));
        items.emplace_back(key, std::move(v));
      }
      return Value::Dict(std::move(items));
    }
    default:
      return absl::InvalidArgumentError("chat template input holds binary or discarded JSON");
  }
}

}  // namespace

Value Value::WithPayload(Kind kind, std::shared_ptr<Payload> p) {
  Value v;
  v.kind_ = kind;
  v.payload_ = std::move(p);
  return v;
}

Value Value::Undefined(std::string hint) {
  auto p = std::make_shared<Payload>();
  p->str = std::move(hint);
  return WithPayload(Kind::kUndefined, std::move(p));
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.int_ = b ? 1 : 0;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}

Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = f;
  return v;
}

Value Value::String(std::string s) {
  auto p = std::make_shared<Payload>();
  p->str = std::move(s);
  return WithPayload(Kind::kString, std::move(p));
}

Value Value::List(ValueList items) {
  auto p = std::make_shared<Payload>();
  p->depth = 1;
  for (const Value& e : items) NoteChild(e, p.get());
  p->list = std::move(items);
  return WithPayload(Kind::kList, std::move(p));
}

Value Value::Tuple(ValueList items) {
  Value v = List(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}

Value Value::Generator(ValueList items) {
  Value v = List(std::move(items));
  v.kind_ = Kind::kGenerator;
  return v;
}

Value Value::FailedGenerator(absl::Status error) {
  auto p = std::make_shared<Payload>();
  p->error = std::move(error);
  return WithPayload(Kind::kGenerator, std::move(p));
}

Value Value::Dict(ValueDict items) {
  auto p = std::make_shared<Payload>();
  p->depth = 1;
  for (const auto& kv : items) NoteChild(kv.second, p.get());
  p->dict = std::move(items);
  return WithPayload(Kind::kDict, std::move(p));
}

Value Value::Ns(std::shared_ptr<Namespace> ns) {
  auto p = std::make_shared<Payload>();
  p->ns = std::move(ns);
  p->holds_reference = true;
  return WithPayload(Kind::kNamespace, std::move(p));
}

Value Value::Loop(std::shared_ptr<LoopState> loop) {
  auto p = std::make_shared<Payload>();
  p->loop = std::move(loop);
  p->holds_reference = true;
  return WithPayload(Kind::kLoop, std::move(p));
}

Value Value::Callable(std::string name, Value receiver) {
  auto p = std::make_shared<Payload>();
  p->str = std::move(name);
  p->list.push_back(std::move(receiver));
  p->holds_reference = true;
  return WithPayload(Kind::kCallable, std::move(p));
}

const std::string& Value::str() const { return payload_ ? payload_->str : EmptyString(); }

const ValueList& Value::items() const {
  static const ValueList* const kEmpty = new ValueList();
  return payload_ ? payload_->list : *kEmpty;
}

const ValueDict& Value::dict() const {
  static const ValueDict* const kEmpty = new ValueDict();
  return payload_ ? payload_->dict : *kEmpty;
}

const Value* Value::Find(absl::string_view key) const {
  for (const auto& kv : dict()) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return "list";
    case Value::Kind::kTuple: return "tuple";
    case Value::Kind::kGenerator: return "generator";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kLoop: return "LoopContext";
    case Value::Kind::kCallable: return "builtin_function_or_method";
  }
  return "object";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt: return v.as_int() != 0;
    case Value::Kind::kFloat: return v.as_double() != 0.0;
    case Value::Kind::kString: return !v.str().empty();
    case Value::Kind::kList:
    case Value::Kind::kTuple: return !v.items().empty();
    case Value::Kind::kDict: return !v.dict().empty();
    default: return true;
  }
}

bool Equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.str() == b.str();
    case K::kList:
    case K::kTuple: {
      if (a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!Equals(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [key, value] : a.dict()) {
        const Value* other = b.Find(key);
        if (other == nullptr || !Equals(value, *other)) return false;
      }
      return true;
    }
    case K::kNamespace: return &a.ns() == &b.ns();
    case K::kLoop: return &a.loop() == &b.loop();
    default: return false;
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    return absl::InvalidArgumentError(a.is_undefined() && !a.str().empty() ? a.str()
                                      : !b.str().empty() ? b.str() : "comparison with undefined");
  }
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    }
    return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_sequence() && a.kind() == b.kind()) {
    const ValueList& x = a.items();
    const ValueList& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return absl::InvalidArgumentError(absl::StrCat("ordering not supported between instances of '",
                                                 TypeName(a), "' and '", TypeName(b), "'"));
}

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The fewest significant digits that read back to the same double, which
  // is what Python's repr() prints.
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof(buf), "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s(buf);
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  const int exp10 = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (s[i] != '.') digits.push_back(s[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exp10 + 1;  // the decimal point sits after `decpt` digits
  const int n = static_cast<int>(digits.size());
  if (decpt > 16 || decpt < -3) {
    std::string mantissa = digits.substr(0, 1);
    if (n > 1) mantissa += "." + digits.substr(1);
    return absl::StrFormat("%s%se%c%02d", sign, mantissa, exp10 < 0 ? '-' : '+', std::abs(exp10));
  }
  if (decpt <= 0) return sign + "0." + std::string(-decpt, '0') + digits;
  if (decpt >= n) return sign + digits + std::string(decpt - n, '0') + ".0";
  return sign + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

std::string Str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return absl::StrCat(v.as_int());
    case Value::Kind::kFloat: return PyFloatRepr(v.as_double());
    case Value::Kind::kString: return v.str();
    case Value::Kind::kNamespace: return "<Namespace " + Repr(Value::Dict(v.ns().attrs)) + ">";
    case Value::Kind::kGenerator: return "<generator object>";
    case Value::Kind::kLoop:
      return absl::StrCat("<LoopContext ", v.loop().index0 + 1, "/", v.loop().items->size(), ">");
    case Value::Kind::kCallable:
      return v.receiver().is_undefined()
                 ? absl::StrCat("<function ", v.str(), ">")
                 : absl::StrCat("<built-in method ", v.str(), " of ", TypeName(v.receiver()),
                                " object>");
    default: return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kString: return PyReprString(v.str());
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const bool tuple = v.kind() == Value::Kind::kTuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) out += ", ";
        out += Repr(v.items()[i]);
      }
      if (tuple && v.items().size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.dict()) {
        if (!first) out += ", ";
        first = false;
        out += PyReprString(key) + ": " + Repr(value);
      }
      return out + "}";
    }
    default: return Str(v);
  }
}

absl::StatusOr<std::string> ToJson(const Value& v, const JsonDumpOptions& opts) {
  std::string out;
  RLMESH_RETURN_IF_ERROR(DumpJson(v, opts, 0, &out));
  return out;
}

absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j) { return FromJsonAt(j, 0); }

}  // namespace rlmesh::actor::chat_template_internal
