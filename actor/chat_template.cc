#include "actor/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "actor/chat_template_ast.h"
#include "actor/chat_template_eval.h"
#include "actor/chat_template_text.h"
#include "actor/chat_template_value.h"

namespace rlmesh::actor {

namespace ct = chat_template_internal;

namespace {

// transformers' _alias_reasoning_fields: the first of these that is set is
// copied to `thinking` (first key) and `reasoning_content` (its own place, or
// last), since templates read one name or the other.
const char* const kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

absl::StatusOr<nlohmann::ordered_json> NormalizeMessages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a JSON array");
  if (messages.empty()) {
    return absl::InvalidArgumentError("cannot apply a chat template to an empty conversation");
  }
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "] is not a JSON object"));
    }
    // transformers drops null-valued keys: templates handle a missing key
    // but would print a null as "None".
    nlohmann::ordered_json kept = nlohmann::ordered_json::object();
    for (const auto& [key, value] : m.items()) {
      if (!value.is_null()) kept[key] = value;
    }
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* field : kReasoningFields) {
      auto it = kept.find(field);
      if (it != kept.end()) {
        reasoning = &*it;
        break;
      }
    }
    if (reasoning == nullptr) {
      out.push_back(std::move(kept));
      continue;
    }
    nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
    aliased["thinking"] = *reasoning;
    for (const auto& [key, value] : kept.items()) aliased[key] = value;
    aliased["reasoning_content"] = *reasoning;
    out.push_back(std::move(aliased));
  }
  return out;
}

}  // namespace

absl::Status ChatTemplateRenderOptions::Validate() const {
  if (max_output_bytes <= 0) {
    return absl::InvalidArgumentError("ChatTemplateRenderOptions.max_output_bytes must be > 0");
  }
  if (max_loop_iterations <= 0) {
    return absl::InvalidArgumentError("ChatTemplateRenderOptions.max_loop_iterations must be > 0");
  }
  return absl::OkStatus();
}

absl::Status ChatTemplateOptions::Validate() const {
  if (!tools.is_null() && !tools.is_array()) {
    return absl::InvalidArgumentError("ChatTemplateOptions.tools must be a JSON array or null");
  }
  if (!documents.is_null() && !documents.is_array()) {
    return absl::InvalidArgumentError("ChatTemplateOptions.documents must be a JSON array or null");
  }
  if (!extra.is_object()) {
    return absl::InvalidArgumentError("ChatTemplateOptions.extra must be a JSON object");
  }
  return render.Validate();
}

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(const std::string& source) {
  if (!ct::IsValidUtf8(source)) return absl::InvalidArgumentError("chat template is not valid UTF-8");
  auto program = std::make_shared<ct::Program>();
  RLMESH_ASSIGN_OR_RETURN(program->body, ct::ParseTemplate(source));
  return ChatTemplate(std::move(program));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                                 const ChatTemplateRenderOptions& options) const {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  if (!context.is_object()) return absl::InvalidArgumentError("chat template context must be a JSON object");
  RLMESH_ASSIGN_OR_RETURN(ct::Value vars, ct::FromJson(context));
  ct::RenderSettings settings;
  settings.builtins.clock = options.clock;
  settings.builtins.time_zone = options.time_zone;
  settings.builtins.max_string_bytes = options.max_output_bytes;
  settings.max_output_bytes = options.max_output_bytes;
  settings.max_loop_iterations = options.max_loop_iterations;
  return ct::RenderProgram(program_->body, vars.dict(), settings);
}

absl::StatusOr<std::string> ChatTemplate::Apply(const nlohmann::ordered_json& messages,
                                                const ChatTemplateOptions& options) const {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  RLMESH_ASSIGN_OR_RETURN(nlohmann::ordered_json normalized, NormalizeMessages(messages));
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = std::move(normalized);
  context["tools"] = options.tools;
  context["documents"] = options.documents;
  context["add_generation_prompt"] = options.add_generation_prompt;
  if (options.bos_token) context["bos_token"] = *options.bos_token;
  if (options.eos_token) context["eos_token"] = *options.eos_token;
  for (const auto& [key, value] : options.extra.items()) context[key] = value;
  return Render(context, options.render);
}

absl::StatusOr<std::string> RenderChatTemplate(const std::string& source,
                                               const nlohmann::ordered_json& messages,
                                               const ChatTemplateOptions& options) {
  RLMESH_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::Parse(source));
  return tmpl.Apply(messages, options);
}

absl::StatusOr<std::string> ChatTemplateFromTokenizerConfig(const std::string& tokenizer_config_json,
                                                            bool with_tools) {
  const auto config = nlohmann::json::parse(tokenizer_config_json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(
        "tokenizer_config.json has no chat_template (newer checkpoints keep it in "
        "chat_template.jinja)");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    return absl::InvalidArgumentError("tokenizer_config.json chat_template must be a string or a list");
  }
  // A list of named templates; transformers turns it into {name: template}.
  const nlohmann::json* fallback = nullptr;
  const nlohmann::json* tool_use = nullptr;
  std::vector<std::string> names;
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
        !entry["name"].is_string() || !entry["template"].is_string()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json chat_template entries need string 'name' and 'template'");
    }
    const std::string name = entry["name"].get<std::string>();
    names.push_back(name);
    if (name == "default") fallback = &entry["template"];
    if (name == "tool_use") tool_use = &entry["template"];
  }
  if (with_tools && tool_use != nullptr) return tool_use->get<std::string>();
  if (fallback != nullptr) return fallback->get<std::string>();
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer_config.json has several chat templates and none named 'default': ",
      absl::StrJoin(names, ", ")));
}

absl::StatusOr<std::string> ChatTemplateBeside(const std::string& folder) {
  const std::filesystem::path dir(folder);
  auto read = [](const std::filesystem::path& p) -> absl::StatusOr<std::string> {
    std::ifstream in(p, std::ios::binary);
    if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", p.string()));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  std::error_code ec;
  if (std::filesystem::exists(dir / "chat_template.jinja", ec)) return read(dir / "chat_template.jinja");
  if (!std::filesystem::exists(dir / "tokenizer_config.json", ec)) {
    return absl::NotFoundError(absl::StrCat(folder, " has neither chat_template.jinja nor tokenizer_config.json"));
  }
  auto config = read(dir / "tokenizer_config.json");
  if (!config.ok()) return config.status();
  auto tmpl = ChatTemplateFromTokenizerConfig(*config);
  if (!tmpl.ok()) {
    return absl::Status(tmpl.status().code(),
                        absl::StrCat((dir / "tokenizer_config.json").string(), ": ", tmpl.status().message()));
  }
  return tmpl;
}

}  // namespace rlmesh::actor
