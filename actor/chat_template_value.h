#pragma once

// Internal to :chat_template. What a chat template computes with: Python's
// objects cut down to what JSON inputs and Jinja expressions produce, with
// Jinja's Undefined (a missing variable, key or attribute) kept apart from
// None (a JSON null). Strings, lists and dicts are immutable and shared, so a
// Value is cheap to copy; a namespace is the one mutable object, as in Jinja's
// sandbox. Containers record their nesting depth so that every recursive walk
// (repr, tojson, equality, destruction) is bounded.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"


namespace rlmesh::actor::chat_template_internal {

// Containers nest at most this deep (inputs and values built by a template).
inline constexpr int kMaxValueDepth = 256;

class Value;
using ValueList = std::vector<Value>;
// Insertion-ordered, as a Python dict: tojson and iteration depend on it.
using ValueDict = std::vector<std::pair<std::string, Value>>;

// `namespace(...)`: attributes a template may reassign from inside loops.
struct Namespace {
  ValueDict attrs;
};

// The `loop` variable of a for loop. Updated in place as the loop advances,
// as Jinja's LoopContext is.
struct LoopState {
  std::shared_ptr<const ValueList> items;  // after the loop's `if` filter
  int64_t index0 = 0;
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kGenerator,  // what Python's lazy filters return: truthy, no len(), no indexing
    kDict,
    kNamespace,
    kLoop,
    kCallable,  // a global function or a method bound to its receiver
  };

  Value() = default;  // Undefined
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value List(ValueList items);
  static Value Tuple(ValueList items);
  static Value Generator(ValueList items);
  // A generator whose computation failed: Python raises only when it is
  // consumed, so the error waits until then.
  static Value FailedGenerator(absl::Status error);
  static Value Dict(ValueDict items);
  static Value Ns(std::shared_ptr<Namespace> ns);
  static Value Loop(std::shared_ptr<LoopState> loop);
  // `receiver` is Undefined for a global function.
  static Value Callable(std::string name, Value receiver);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  // bool counts: Python's bool is an int.
  bool is_integral() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }
  bool is_number() const { return is_integral() || kind_ == Kind::kFloat; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // bool as 0/1
  double as_double() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  // String text; the name of a callable; the hint of an Undefined.
  const std::string& str() const;
  const ValueList& items() const;  // list, tuple or generator
  const ValueDict& dict() const;
  Namespace& ns() const { return *payload_->ns; }
  LoopState& loop() const { return *payload_->loop; }
  const Value& receiver() const { return payload_->list[0]; }
  // OK except for a FailedGenerator.
  absl::Status generator_error() const { return payload_ ? payload_->error : absl::OkStatus(); }

  // Dict lookup; nullptr when absent.
  const Value* Find(absl::string_view key) const;
  // Containers: 1 + the depth of the deepest element. Scalars: 0.
  int depth() const { return payload_ ? payload_->depth : 0; }
  // Whether this holds a namespace, loop or callable anywhere inside. Such
  // values may not be stored in a namespace, which keeps values acyclic.
  bool holds_reference() const { return payload_ && payload_->holds_reference; }

 private:
  struct Payload {
    std::string str;
    ValueList list;
    ValueDict dict;
    std::shared_ptr<Namespace> ns;
    std::shared_ptr<LoopState> loop;
    absl::Status error;
    int depth = 0;
    bool holds_reference = false;
  };
  static Value WithPayload(Kind kind, std::shared_ptr<Payload> p);

  Kind kind_ = Kind::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const Payload> payload_;
};

// Python's type name, for error messages ("'int' object is not iterable").
std::string TypeName(const Value& v);
// Python's bool(v); Undefined is false.
bool Truthy(const Value& v);
// Python's ==, with Jinja's Undefined equal only to Undefined.
bool Equals(const Value& a, const Value& b);
// Python's ordering (<: -1, ==: 0, >: 1) for numbers, strings and sequences
// of one kind; anything else is a TypeError, as in Python.
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// Python's str(v) (what `{{ v }}`, `~` and `|string` produce) and repr(v).
std::string Str(const Value& v);
std::string Repr(const Value& v);
// Python's repr() of a float: shortest round trip, "1.0", "1e+16".
std::string PyFloatRepr(double d);

// json.dumps with the arguments transformers' tojson passes through.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // absent: one line
  std::string item_separator = ", ";  // ", " one line, "," when indented
  std::string key_separator = ": ";
  bool sort_keys = false;
};
absl::StatusOr<std::string> ToJson(const Value& v, const JsonDumpOptions& opts);

// JSON in: objects keep their key order; strings must be valid UTF-8.
absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j);

}  // namespace rlmesh::actor::chat_template_internal
