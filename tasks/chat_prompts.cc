#include "tasks/chat_prompts.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "actor/chat_template.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token in tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> SpecialToken(const Json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

struct Source {
  std::string text;
  std::optional<std::string> bos, eos;
};

// The template and special tokens a task asks for.
absl::StatusOr<Source> Resolve(const TaskConfig& task, const std::string& tokenizer_spec) {
  Source src;
  std::string folder;
  if (!tokenizer_spec.empty() && tokenizer_spec != "char") {
    folder = fs::is_directory(tokenizer_spec) ? tokenizer_spec : fs::path(tokenizer_spec).parent_path().string();
  }
  Json cfg;
  const std::string cfg_path = folder.empty() ? "" : folder + "/tokenizer_config.json";
  if (!cfg_path.empty() && fs::exists(cfg_path)) {
    auto text = ReadFile(cfg_path);
    if (!text.ok()) return text.status();
    cfg = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("task.chat_template: ", cfg_path, " is not a JSON object"));
    }
    src.bos = SpecialToken(cfg, "bos_token");
    src.eos = SpecialToken(cfg, "eos_token");
  }
  if (task.chat_template() != "model") {
    auto text = ReadFile(task.chat_template());
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("task.chat_template: ", text.status().message()));
    src.text = *std::move(text);
    return src;
  }
  if (folder.empty()) {
    return absl::InvalidArgumentError(
        "task.chat_template: \"model\" needs model.tokenizer to be a tokenizer folder or tokenizer.json path "
        "(the char tokenizer has no template)");
  }
  auto text = actor::ChatTemplateBeside(folder);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("task.chat_template: \"model\": ", text.status().message()));
  src.text = *std::move(text);
  return src;
}

}  // namespace

absl::StatusOr<ChatRenderer> ChatRenderer::FromTask(const TaskConfig& task, const std::string& tokenizer_spec) {
  if (task.chat_template().empty()) return absl::InvalidArgumentError("task.chat_template: required here");
  auto src = Resolve(task, tokenizer_spec);
  if (!src.ok()) return src.status();
  actor::ChatTemplateOptions opts;
  opts.bos_token = src->bos;
  opts.eos_token = src->eos;
  if (!task.chat_template_kwargs().empty()) {
    Json extra = Json::parse(task.chat_template_kwargs(), nullptr, /*allow_exceptions=*/false);
    if (extra.is_discarded() || !extra.is_object()) {
      return absl::InvalidArgumentError("task.chat_template_kwargs: must be a JSON object, e.g. {\"enable_thinking\": false}");
    }
    opts.extra = std::move(extra);
  }
  auto r = FromSource(src->text, std::move(opts));
  if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat("task.chat_template: ", r.status().message()));
  return r;
}

absl::StatusOr<ChatRenderer> ChatRenderer::FromSource(const std::string& source, actor::ChatTemplateOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto tmpl = actor::ChatTemplate::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return ChatRenderer(*std::move(tmpl), std::move(options));
}

absl::StatusOr<std::string> ChatRenderer::Render(const Json& messages, bool add_generation_prompt,
                                                 const Json& tools) const {
  actor::ChatTemplateOptions opts = options_;
  opts.add_generation_prompt = add_generation_prompt;
  if (!tools.is_null()) opts.tools = tools;
  return template_.Apply(messages, opts);
}

absl::Status ApplyChatTemplateToExamples(const TaskConfig& task, const std::string& tokenizer_spec,
                                         std::vector<Example>* train, std::vector<Example>* eval) {
  if (task.chat_template().empty()) return absl::OkStatus();
  auto renderer = ChatRenderer::FromTask(task, tokenizer_spec);
  if (!renderer.ok()) return renderer.status();
  for (auto* split : {train, eval}) {
    for (Example& e : *split) {
      Json messages = Json::array();
      if (!task.system_prompt().empty()) messages.push_back({{"role", "system"}, {"content", task.system_prompt()}});
      messages.push_back({{"role", "user"}, {"content", e.prompt}});
      auto text = renderer->Render(messages, /*add_generation_prompt=*/true);
      if (!text.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("task.chat_template: example ", e.id, ": ", text.status().message()));
      }
      e.prompt = *std::move(text);
    }
  }
  return absl::OkStatus();
}

}  // namespace rlmesh
