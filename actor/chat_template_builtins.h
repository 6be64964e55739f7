#pragma once

// Internal to :chat_template. What a template can call and look up: Jinja's
// filters and tests (the subset chat templates use), the globals transformers
// adds (raise_exception, strftime_now, namespace, dict) beside Jinja's own
// (range), the `str`/`dict` methods, and attribute and item access with the
// lookup order of Jinja's sandbox. Errors carry no line; the evaluator adds it.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "actor/chat_template_value.h"

namespace rlmesh::actor::chat_template_internal {

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// What builtins need from the render in progress.
struct BuiltinEnv {
  std::function<absl::Time()> clock;  // strftime_now
  absl::TimeZone time_zone;
  int64_t max_string_bytes = 0;  // a string a builtin builds may not exceed this
};

bool IsKnownFilter(absl::string_view name);
bool IsKnownTest(absl::string_view name);

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& subject,
                                  const CallArgs& args, const BuiltinEnv& env);
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& subject, const CallArgs& args);

// `obj.name`: an attribute (a method, a loop field) first, then an item.
absl::StatusOr<Value> GetAttr(const Value& obj, absl::string_view name);
// `obj[key]`: an item first, then (for a string key) an attribute. Missing
// items are Undefined, as in Jinja; only Undefined itself fails.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// `obj[start:stop:step]`; absent bounds are None.
absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step);

// The global `name` (range, namespace, dict, raise_exception, strftime_now),
// or Undefined.
Value LookupGlobal(absl::string_view name);
// Calls a global function or a bound method.
absl::StatusOr<Value> CallValue(const Value& callee, const CallArgs& args, const BuiltinEnv& env);

// An Undefined's failure when used ("'x' is undefined").
absl::Status UndefinedError(const Value& undefined);
// The items `for` walks: a sequence's elements, a dict's keys, a string's
// characters; Undefined gives none.
absl::StatusOr<ValueList> Iterate(const Value& v);

}  // namespace rlmesh::actor::chat_template_internal
