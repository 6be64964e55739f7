#pragma once

// Chat templates: renders the Jinja `chat_template` of a Hugging Face
// tokenizer to exactly the text transformers' `apply_chat_template(...,
// tokenize=False)` produces, with our own interpreter of the Jinja subset
// that Llama 3.x and Qwen2.5/Qwen3 style templates use. The environment is
// the one transformers builds: trim_blocks and lstrip_blocks on, loop
// controls on, `tojson` as json.dumps(ensure_ascii=False, ...), and the
// globals raise_exception, strftime_now, namespace and dict.
//
// Supported:
//  - Text, {{ }}, {% %}, {# #}, whitespace control `-` and `+` on either
//    side, {% raw %}.
//  - Tags: if/elif/else, for (tuple targets, `if` filter, else, the `loop`
//    fields index/index0/revindex/revindex0/first/last/length/previtem/
//    nextitem/depth and loop.cycle), break, continue, set (names, tuples,
//    `ns.attr`, and the {% set x %}...{% endset %} block form with filters),
//    and transformers' {% generation %} (renders its body).
//  - Expressions: literals (strings with Python escapes, ints, floats,
//    true/false/none, lists, tuples, dicts), attribute and item access,
//    slices, calls, + - * / // % **, ~, comparisons (chained), in / not in,
//    and/or/not, `a if c else b`, `is [not] test`.
//  - Filters: abs capitalize count d default dictsort first float int items
//    join last length list lower map reject rejectattr replace reverse safe
//    select selectattr sort string sum title tojson trim upper.
//  - Tests: boolean callable defined divisibleby eq/equalto/== even false
//    float ge gt in integer iterable le lower lt mapping ne none number odd
//    sameas sequence string true undefined upper.
//  - Methods: str strip/lstrip/rstrip/split/rsplit/startswith/endswith/upper/
//    lower/title/capitalize/replace/find/join/removeprefix/removesuffix;
//    dict get/items/keys/values. Globals: range, namespace, dict,
//    raise_exception, strftime_now.
//  - Jinja's Undefined: a missing variable, key or attribute renders as ""
//    and is false, iterable and empty; using it otherwise (arithmetic, an
//    attribute of it, a call) is an error, as in Jinja.
// Refused with an error naming the construct and its line (UNIMPLEMENTED):
// macro, call, filter blocks, include, import, extends, block, with, do,
// recursive loops, any other filter/test/method/function, *args/**kwargs,
// string % formatting, non-string dict keys.
//  - Python's generators: select/reject/selectattr/rejectattr/map/items/
//    reverse results are true even when empty, have no length and cannot be
//    indexed, as in Jinja.
// Known differences from Python: case mapping covers Latin, Greek, Cyrillic
// and fullwidth letters only; integers are 64-bit (overflow is OUT_OF_RANGE);
// range() and dict.items()/keys()/values() are lists, so printing one shows a
// list where Python shows `range(0, 3)` or `dict_items([...])`; a generator
// can be iterated more than once; an unknown filter or test is refused when
// the template is parsed, where Jinja 3 fails only if that branch runs.
//
// Errors: INVALID_ARGUMENT for template syntax and for render-time failures
// (raise_exception's message, undefined values used, type errors);
// UNIMPLEMENTED for valid Jinja outside the subset; RESOURCE_EXHAUSTED when a
// render passes its limits. Messages start "chat template line N: ". Nesting
// is bounded, so no input or template can overflow the stack or hang.
//
// Thread-safety: a parsed ChatTemplate is immutable; Render and Apply are
// const and safe to call concurrently on one template.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace rlmesh::actor {

namespace chat_template_internal {
struct Program;
}  // namespace chat_template_internal

// Bounds and the clock of one render.
struct ChatTemplateRenderOptions {
  // "Now" for strftime_now(). Default (empty): absl::Now().
  std::function<absl::Time()> clock;
  // Zone strftime_now() formats the clock in; transformers formats the
  // process's local time. Default: local.
  absl::TimeZone time_zone = absl::LocalTimeZone();
  // Output bytes, also the bound on any string (bytes) or list (items) the
  // template builds; past it the render fails with RESOURCE_EXHAUSTED.
  // Default: 16 MiB.
  int64_t max_output_bytes = int64_t{16} << 20;
  // Loop iterations of one render, all loops together; past it the render
  // fails with RESOURCE_EXHAUSTED. Default: 1'000'000.
  int64_t max_loop_iterations = 1'000'000;

  absl::Status Validate() const;
};

// What apply_chat_template passes to the template besides the messages. JSON
// is nlohmann::ordered_json throughout: key order shows in tojson output and
// dict iteration, so it must survive from the caller's JSON text.
struct ChatTemplateOptions {
  // `add_generation_prompt`: end with the header of an assistant turn.
  // Default: false.
  bool add_generation_prompt = false;
  // `tools`: an array of tool JSON schemas, or null (the template sees none,
  // as transformers passes tools=None). Default: null.
  nlohmann::ordered_json tools = nullptr;
  // `documents` for retrieval templates: an array or null. Default: null.
  nlohmann::ordered_json documents = nullptr;
  // The tokenizer's special tokens, passed as `bos_token`/`eos_token`; unset
  // ones are undefined in the template. Default: unset.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // More template variables, e.g. {"enable_thinking": false}; they override
  // the special tokens, as apply_chat_template's kwargs do. Default: {}.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  ChatTemplateRenderOptions render;

  absl::Status Validate() const;
};

class ChatTemplate {
 public:
  // Parses a template. Syntax errors are INVALID_ARGUMENT and unsupported
  // constructs UNIMPLEMENTED, both naming the line.
  static absl::StatusOr<ChatTemplate> Parse(const std::string& source);

  // Renders with `context` (a JSON object) as the variables, adding nothing.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const ChatTemplateRenderOptions& options = {}) const;

  // Renders a conversation as transformers' apply_chat_template(messages,
  // tokenize=False, ...) does: null-valued keys of each message are dropped;
  // a message's reasoning (`reasoning_content`, `thinking` or `reasoning`) is
  // copied to both `thinking` and `reasoning_content`; the template sees
  // messages, tools, documents, add_generation_prompt, the special tokens and
  // `extra`. REQUIRES: `messages` is a non-empty array of objects
  // (INVALID_ARGUMENT otherwise).
  absl::StatusOr<std::string> Apply(const nlohmann::ordered_json& messages,
                                    const ChatTemplateOptions& options) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const chat_template_internal::Program> program)
      : program_(std::move(program)) {}

  std::shared_ptr<const chat_template_internal::Program> program_;
};

// ChatTemplate::Parse(source) then Apply(messages, options).
absl::StatusOr<std::string> RenderChatTemplate(const std::string& source,
                                               const nlohmann::ordered_json& messages,
                                               const ChatTemplateOptions& options);

// The `chat_template` of a tokenizer_config.json: the string, or from a list
// of {"name", "template"} the one transformers picks ("tool_use" when
// `with_tools` and present, else "default"). NOT_FOUND when the field is
// absent (newer checkpoints keep it in chat_template.jinja instead);
// INVALID_ARGUMENT for malformed JSON or a list without a usable name.
absl::StatusOr<std::string> ChatTemplateFromTokenizerConfig(
    const std::string& tokenizer_config_json, bool with_tools = false);

// The chat template kept beside a tokenizer in `folder`, where transformers
// looks: chat_template.jinja, else tokenizer_config.json's chat_template.
// NOT_FOUND when the folder has neither; INVALID_ARGUMENT naming the file
// when it cannot be read or its JSON is malformed. The one reader of this
// rule (LoadTokenizer and tasks' chat prompts both call it).
absl::StatusOr<std::string> ChatTemplateBeside(const std::string& folder);

}  // namespace rlmesh::actor
