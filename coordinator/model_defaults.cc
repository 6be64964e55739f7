#include "coordinator/model_defaults.h"

#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/json_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

using nlohmann::json;

// A number field of generation_config.json; nullopt when absent or null.
absl::StatusOr<std::optional<double>> Number(const json& j, const std::string& path, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, " must be a number"));
  return std::optional<double>(it->get<double>());
}

}  // namespace

absl::Status ApplyModelFolderDefaults(ExperimentConfig* config, const std::string& folder,
                                      std::vector<std::string>* notes) {
  ModelConfig* m = config->mutable_model();
  if (m->init() != "checkpoint" || folder.empty()) return absl::OkStatus();
  std::error_code ec;
  if (m->tokenizer().empty() && std::filesystem::exists(folder + "/tokenizer.json", ec)) {
    m->set_tokenizer(folder);
    notes->push_back(absl::StrCat("model.tokenizer ", folder, " (model.path)"));
  }
  // The context window is the checkpoint's (config.json), unless set.
  if (m->max_positions() == 0) {
    const std::string config_path = folder + "/config.json";
    const absl::StatusOr<json> hf_config = ReadJsonObjectFile(config_path);
    if (!hf_config.ok() && !absl::IsNotFound(hf_config.status())) return hf_config.status();
    if (hf_config.ok()) {
      auto value = Number(*hf_config, config_path, "max_position_embeddings");
      if (!value.ok()) return value.status();
      if (value->has_value()) {
        if (**value < 2 || **value > (1 << 30)) {
          return absl::InvalidArgumentError(absl::StrCat(config_path, ": max_position_embeddings must be in [2, 2^30]"));
        }
        m->set_max_positions(static_cast<int32_t>(**value));
        notes->push_back(absl::StrCat("model.max_positions ", m->max_positions(), " from ", config_path));
      }
    }
  }
  const std::string path = folder + "/generation_config.json";
  const absl::StatusOr<json> file = ReadJsonObjectFile(path);
  if (absl::IsNotFound(file.status())) return absl::OkStatus();
  RLMESH_RETURN_IF_ERROR(file.status());
  const json& j = *file;

  SamplingParams* s = config->mutable_rollout()->mutable_sampling();
  struct Field {
    const char* key;  // generation_config.json and rollout.sampling alike
    double current;
    bool (*valid)(double);
    const char* range;
    void (*set)(SamplingParams*, double);
  };
  const Field fields[] = {
      {"temperature", s->temperature(), [](double v) { return v > 0; }, "must be > 0",
       [](SamplingParams* p, double v) { p->set_temperature(static_cast<float>(v)); }},
      {"top_p", s->top_p(), [](double v) { return v > 0 && v <= 1; }, "must be in (0, 1]",
       [](SamplingParams* p, double v) { p->set_top_p(static_cast<float>(v)); }},
      {"top_k", static_cast<double>(s->top_k()),
       [](double v) { return v >= 0 && v <= (1 << 24) && v == static_cast<int>(v); }, "must be an integer >= 0",
       [](SamplingParams* p, double v) { p->set_top_k(static_cast<int32_t>(v)); }},
  };
  for (const Field& f : fields) {
    auto value = Number(j, path, f.key);
    if (!value.ok()) return value.status();
    if (!value->has_value()) continue;
    if (!f.valid(**value)) return absl::InvalidArgumentError(absl::StrCat(path, ": ", f.key, " ", f.range));
    if (f.current != 0) {
      notes->push_back(absl::StrCat("rollout.sampling.", f.key, " ", f.current, " from the experiment (", path,
                                    " has ", **value, ")"));
      continue;
    }
    f.set(s, **value);
    notes->push_back(absl::StrCat("rollout.sampling.", f.key, " ", **value, " from ", path));
  }
  return absl::OkStatus();
}

}  // namespace rlmesh
