#include "actor/model_config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace rlmesh::actor {
namespace {

using nlohmann::json;

absl::Status Invalid(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("ModelConfig.", field, ": ", why));
}

// Reads an integer field; absent keeps `*out`.
absl::Status GetInt(const json& j, const char* key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be an integer"));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status GetDouble(const json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be a number"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status GetBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be a boolean"));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

// bos/eos may be an int or a list of ints (Llama 3 lists several eos ids);
// the first is kept.
absl::Status GetTokenId(const json& j, const char* key, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_number_integer()) {
    *out = it->get<int64_t>();
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    *out = (*it)[0].get<int64_t>();
  } else {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be an integer"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t DefaultIntermediateSize(int64_t hidden_size) {
  int64_t v = (8 * hidden_size + 2) / 3;
  return (v + 31) / 32 * 32;
}

absl::Status ModelConfig::Validate() const {
  if (arch != "llama" && arch != "qwen2") return Invalid("arch", "must be \"llama\" or \"qwen2\", got \"" + arch + "\"");
  if (vocab_size <= 0) return Invalid("vocab_size", "must be > 0");
  if (hidden_size <= 0) return Invalid("hidden_size", "must be > 0");
  if (intermediate_size <= 0) return Invalid("intermediate_size", "must be > 0");
  if (num_layers <= 0) return Invalid("num_layers", "must be > 0");
  if (num_heads <= 0) return Invalid("num_heads", "must be > 0");
  if (num_kv_heads <= 0) return Invalid("num_kv_heads", "must be > 0");
  if (num_heads % num_kv_heads != 0) {
    return Invalid("num_kv_heads", absl::StrCat("must divide num_heads (", num_heads, "), got ", num_kv_heads));
  }
  if (head_dim < 0) return Invalid("head_dim", "must be >= 0");
  if (head_dim == 0 && hidden_size % num_heads != 0) {
    return Invalid("num_heads", absl::StrCat("must divide hidden_size (", hidden_size, ") when head_dim is 0"));
  }
  if (HeadDim() % 2 != 0) return Invalid("head_dim", "must be even (RoPE rotates pairs)");
  if (max_positions <= 0) return Invalid("max_positions", "must be > 0");
  if (!(rope_theta > 0)) return Invalid("rope_theta", "must be > 0");
  if (!(rms_norm_eps > 0)) return Invalid("rms_norm_eps", "must be > 0");
  for (auto [name, id] : {std::pair<const char*, int64_t>{"bos_token_id", bos_token_id},
                          {"eos_token_id", eos_token_id},
                          {"pad_token_id", pad_token_id}}) {
    if (id < -1 || id >= vocab_size) return Invalid(name, absl::StrCat("out of range [-1, vocab_size): ", id));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ModelConfig::FromHfConfigJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto cfg = FromHfConfigJsonString(ss.str());
  if (!cfg.ok()) {
    return absl::Status(cfg.status().code(), absl::StrCat(path, ": ", cfg.status().message()));
  }
  return cfg;
}

absl::StatusOr<ModelConfig> ModelConfig::FromHfConfigJsonString(const std::string& text) {
  // A field of the wrong JSON type throws inside nlohmann; report it instead.
  try {
    return FromHfConfigJsonInternal(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", e.what()));
  }
}

absl::StatusOr<ModelConfig> ModelConfig::FromHfConfigJsonInternal(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  ModelConfig c;
  std::string model_type = j.value("model_type", std::string("llama"));
  if (model_type == "qwen2") {
    c.arch = "qwen2";
    c.qkv_bias = true;
  } else if (model_type == "llama" || model_type == "mistral") {
    c.arch = "llama";
    c.qkv_bias = false;
  } else {
    return absl::InvalidArgumentError("config.json: unsupported model_type \"" + model_type + "\"");
  }

  absl::Status s;
  for (auto [key, field] : {std::pair<const char*, int64_t*>{"vocab_size", &c.vocab_size},
                            {"hidden_size", &c.hidden_size},
                            {"intermediate_size", &c.intermediate_size},
                            {"num_hidden_layers", &c.num_layers},
                            {"num_attention_heads", &c.num_heads},
                            {"max_position_embeddings", &c.max_positions}}) {
    if (!j.contains(key)) return absl::InvalidArgumentError(absl::StrCat("config.json: missing \"", key, "\""));
    if (!(s = GetInt(j, key, field)).ok()) return s;
  }
  c.num_kv_heads = c.num_heads;
  if (!(s = GetInt(j, "num_key_value_heads", &c.num_kv_heads)).ok()) return s;
  if (!(s = GetInt(j, "head_dim", &c.head_dim)).ok()) return s;
  if (c.num_heads > 0 && c.head_dim * c.num_heads == c.hidden_size) c.head_dim = 0;
  if (!(s = GetDouble(j, "rope_theta", &c.rope_theta)).ok()) return s;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    std::string type = it->value("rope_type", std::string("default"));
    if (type != "default") return absl::InvalidArgumentError("config.json: rope_type \"" + type + "\" is not supported");
    if (!(s = GetDouble(*it, "rope_theta", &c.rope_theta)).ok()) return s;
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    std::string type = it->is_object() ? it->value("rope_type", it->value("type", std::string("default"))) : "?";
    if (type != "default") return absl::InvalidArgumentError("config.json: rope_scaling \"" + type + "\" is not supported");
  }
  if (!(s = GetDouble(j, "rms_norm_eps", &c.rms_norm_eps)).ok()) return s;
  c.tie_embeddings = false;
  if (!(s = GetBool(j, "tie_word_embeddings", &c.tie_embeddings)).ok()) return s;
  if (c.arch == "llama") {
    if (!(s = GetBool(j, "attention_bias", &c.qkv_bias)).ok()) return s;
    bool mlp_bias = false;
    if (!(s = GetBool(j, "mlp_bias", &mlp_bias)).ok()) return s;
    if (mlp_bias) return absl::InvalidArgumentError("config.json: mlp_bias=true is not supported");
  }
  if (j.value("hidden_act", std::string("silu")) != "silu") {
    return absl::InvalidArgumentError("config.json: only hidden_act \"silu\" is supported");
  }
  if (auto it = j.find("architectures"); it != j.end() && it->is_array()) {
    for (const auto& a : *it) {
      if (a.is_string() && a.get<std::string>().find("ForSequenceClassification") != std::string::npos) {
        c.value_head = true;
      }
    }
  }
  if (!(s = GetTokenId(j, "bos_token_id", &c.bos_token_id)).ok()) return s;
  if (!(s = GetTokenId(j, "eos_token_id", &c.eos_token_id)).ok()) return s;
  if (!(s = GetTokenId(j, "pad_token_id", &c.pad_token_id)).ok()) return s;
  if (!(s = c.Validate()).ok()) return s;
  return c;
}

std::string ModelConfig::ToHfConfigJson(const std::string& dtype) const {
  json j;
  const bool qwen = arch == "qwen2";
  std::string base = qwen ? "Qwen2" : "Llama";
  j["architectures"] = {base + (value_head ? "ForSequenceClassification" : "ForCausalLM")};
  j["model_type"] = arch;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = HeadDim();
  j["max_position_embeddings"] = max_positions;
  j["rope_theta"] = rope_theta;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", rope_theta}};
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_embeddings;
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  if (qwen) {
    // Qwen2 always has q/k/v bias; the flag is implied by the model type.
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  } else {
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = false;
  }
  if (value_head) j["num_labels"] = 1;
  j["bos_token_id"] = bos_token_id >= 0 ? json(bos_token_id) : json(nullptr);
  j["eos_token_id"] = eos_token_id >= 0 ? json(eos_token_id) : json(nullptr);
  j["pad_token_id"] = pad_token_id >= 0 ? json(pad_token_id) : json(nullptr);
  j["torch_dtype"] = dtype;
  j["dtype"] = dtype;
  return j.dump(2) + "\n";
}

}  // namespace rlmesh::actor
