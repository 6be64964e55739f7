#pragma once

// Task text rendered through a chat template (task.chat_template): the
// model's own (tokenizer_config.json / chat_template.jinja beside the
// tokenizer) or a Jinja file, with the tokenizer's bos/eos strings and the
// task's template variables. Stateless; safe for concurrent use.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/chat_template.h"
#include "nlohmann/json.hpp"
#include "proto/config.pb.h"
#include "tasks/task.h"

namespace rlmesh {

// The template a task asks for, ready to render conversations. Immutable;
// safe for concurrent use.
class ChatRenderer {
 public:
  // task.chat_template ("model" or a Jinja path; must not be empty) with
  // task.chat_template_kwargs; `tokenizer_spec` is model.tokenizer (where
  // "model" finds its template and the bos/eos token strings). Errors name
  // the task field.
  static absl::StatusOr<ChatRenderer> FromTask(const TaskConfig& task, const std::string& tokenizer_spec);
  // A template source with the options given (tests, callers with their own
  // template).
  static absl::StatusOr<ChatRenderer> FromSource(const std::string& source, actor::ChatTemplateOptions options);

  // apply_chat_template(messages, tools=tools, tokenize=False,
  // add_generation_prompt=...); `tools` is null or an array of schemas.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                     const nlohmann::ordered_json& tools = nullptr) const;
  // The tokenizer's eos token string, when the tokenizer folder names one.
  const std::optional<std::string>& eos_token() const { return options_.eos_token; }

 private:
  ChatRenderer(actor::ChatTemplate tmpl, actor::ChatTemplateOptions options)
      : template_(std::move(tmpl)), options_(std::move(options)) {}
  actor::ChatTemplate template_;
  actor::ChatTemplateOptions options_;
};

// Rewrites each example's prompt as the template renders the conversation
// [system (if task.system_prompt), user: prompt] with the assistant's header
// appended. No-op when task.chat_template is empty. Errors name the task
// field.
absl::Status ApplyChatTemplateToExamples(const TaskConfig& task, const std::string& tokenizer_spec,
                                         std::vector<Example>* train, std::vector<Example>* eval);

}  // namespace rlmesh
