#pragma once

// Task prompts rendered through a chat template (task.chat_template): the
// model's own (tokenizer_config.json / chat_template.jinja beside the
// tokenizer) or a Jinja file, with an optional system turn and template
// variables. Stateless; safe for concurrent use.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/config.pb.h"
#include "tasks/task.h"

namespace rlmesh {

// Rewrites each example's prompt as the template renders the conversation
// [system (if task.system_prompt), user: prompt] with the assistant's header
// appended. `tokenizer_spec` is model.tokenizer (where "model" finds its
// template and the bos/eos token strings). No-op when task.chat_template is
// empty. Errors name the task field.
absl::Status ApplyChatTemplateToExamples(const TaskConfig& task, const std::string& tokenizer_spec,
                                         std::vector<Example>* train, std::vector<Example>* eval);

}  // namespace rlmesh
