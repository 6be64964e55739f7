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

// Reads transformers' RoPE scaling: the 5.x `rope_parameters` object (which
// also carries rope_theta), else the 4.x `rope_scaling` object. Keys that
// change the computation but are not implemented are refused by name.
absl::Status ParseRope(const json& j, ModelConfig* c) {
  const json* r = nullptr;
  const char* where = "rope_parameters";
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    r = &*it;
  } else if (auto it2 = j.find("rope_scaling"); it2 != j.end() && !it2->is_null()) {
    if (!it2->is_object()) return absl::InvalidArgumentError("config.json: \"rope_scaling\" must be an object");
    r = &*it2;
    where = "rope_scaling";
  }
  if (r == nullptr) return absl::OkStatus();
  for (auto it = r->begin(); it != r->end(); ++it) {
    if (it->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: ", where, " per layer type (\"", it.key(),
                                                     "\") is not supported"));
    }
  }
  std::string type = "default";
  for (const char* key : {"type", "rope_type"}) {
    if (auto it = r->find(key); it != r->end()) {
      if (!it->is_string()) return absl::InvalidArgumentError(absl::StrCat("config.json: ", where, ".", key, " must be a string"));
      type = it->get<std::string>();
    }
  }
  RopeScaling& rope = c->rope;
  rope.type = type;
  if (type != "default" && type != "linear" && type != "dynamic" && type != "llama3" && type != "yarn") {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", where, " rope_type \"", type,
                                                   "\" is not supported (default, linear, dynamic, llama3, yarn)"));
  }
  absl::Status s;
  if (!(s = GetDouble(*r, "rope_theta", &c->rope_theta)).ok()) return s;
  double partial = 1.0;
  if (!(s = GetDouble(*r, "partial_rotary_factor", &partial)).ok()) return s;
  if (!(s = GetDouble(j, "partial_rotary_factor", &partial)).ok()) return s;
  if (partial != 1.0) return absl::InvalidArgumentError("config.json: partial_rotary_factor != 1 is not supported");
  if (type == "default") return absl::OkStatus();
  auto require = [&](const char* key) -> absl::Status {
    auto it = r->find(key);
    if (it == r->end() || it->is_null()) {
      return absl::InvalidArgumentError(absl::StrCat("config.json: ", where, " (", type, ") needs \"", key, "\""));
    }
    return absl::OkStatus();
  };
  if (type != "yarn" && !(s = require("factor")).ok()) return s;
  if (!(s = GetDouble(*r, "factor", &rope.factor)).ok()) return s;
  if (type == "llama3") {
    for (const char* key : {"low_freq_factor", "high_freq_factor"}) {
      if (!(s = require(key)).ok()) return s;
    }
    if (!(s = GetDouble(*r, "low_freq_factor", &rope.low_freq_factor)).ok()) return s;
    if (!(s = GetDouble(*r, "high_freq_factor", &rope.high_freq_factor)).ok()) return s;
  }
  if (type == "llama3" || type == "yarn") {
    // As transformers: a top-level original_max_position_embeddings wins,
    // then the dictionary's, then max_position_embeddings.
    if (!(s = GetInt(*r, "original_max_position_embeddings", &rope.original_max_positions)).ok()) return s;
    if (!(s = GetInt(j, "original_max_position_embeddings", &rope.original_max_positions)).ok()) return s;
  }
  if (type == "yarn") {
    if (!(s = GetDouble(*r, "attention_factor", &rope.attention_factor)).ok()) return s;
    if (!(s = GetDouble(*r, "beta_fast", &rope.beta_fast)).ok()) return s;
    if (!(s = GetDouble(*r, "beta_slow", &rope.beta_slow)).ok()) return s;
    if (!(s = GetDouble(*r, "mscale", &rope.mscale)).ok()) return s;
    if (!(s = GetDouble(*r, "mscale_all_dim", &rope.mscale_all_dim)).ok()) return s;
    if (!(s = GetBool(*r, "truncate", &rope.truncate)).ok()) return s;
    // A yarn config without a factor stretches max/original (transformers).
    auto f = r->find("factor");
    if (f == r->end() || f->is_null()) {
      int64_t orig = rope.original_max_positions;
      int64_t max_pos = 0;
      if (!(s = GetInt(j, "max_position_embeddings", &max_pos)).ok()) return s;
      if (orig <= 0) return absl::InvalidArgumentError("config.json: rope (yarn) needs \"factor\"");
      rope.factor = static_cast<double>(max_pos) / static_cast<double>(orig);
    }
  }
  return absl::OkStatus();
}

json RopeJson(const ModelConfig& c) {
  const RopeScaling& r = c.rope;
  json j = {{"rope_type", r.type}, {"rope_theta", c.rope_theta}};
  if (r.type == "default") return j;
  j["factor"] = r.factor;
  const int64_t orig = r.original_max_positions > 0 ? r.original_max_positions : c.max_positions;
  if (r.type == "llama3") {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
    j["original_max_position_embeddings"] = orig;
  } else if (r.type == "yarn") {
    j["original_max_position_embeddings"] = orig;
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    j["truncate"] = r.truncate;
    if (r.attention_factor > 0) j["attention_factor"] = r.attention_factor;
    if (r.mscale != 0) j["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0) j["mscale_all_dim"] = r.mscale_all_dim;
  }
  return j;
}

}  // namespace

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts <= 0) return false;
  for (int64_t l : mlp_only_layers) {
    if (l == layer) return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::NumMoeLayers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_layers; ++i) n += IsMoeLayer(i) ? 1 : 0;
  return n;
}

int64_t DefaultIntermediateSize(int64_t hidden_size) {
  int64_t v = (8 * hidden_size + 2) / 3;
  return (v + 31) / 32 * 32;
}

absl::Status ModelConfig::Validate() const {
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "qwen3_moe" && arch != "qwen2_moe") {
    return Invalid("arch", "must be \"llama\", \"qwen2\", \"qwen3\", \"qwen3_moe\" or \"qwen2_moe\", got \"" +
                               arch + "\"");
  }
  if (!IsMoeArch() && num_experts != 0) return Invalid("num_experts", "only qwen3_moe and qwen2_moe have experts");
  if (arch != "qwen2_moe" && shared_expert_intermediate_size != 0) {
    return Invalid("shared_expert_intermediate_size", "only qwen2_moe has a shared expert");
  }
  if (shared_expert_intermediate_size < 0) return Invalid("shared_expert_intermediate_size", "must be >= 0");
  if (IsMoeArch()) {
    if (num_experts <= 0) return Invalid("num_experts", "must be > 0 for " + arch);
    if (num_experts_per_tok <= 0 || num_experts_per_tok > num_experts) {
      return Invalid("num_experts_per_tok", absl::StrCat("must be in [1, num_experts=", num_experts, "], got ",
                                                         num_experts_per_tok));
    }
    if (moe_intermediate_size <= 0) return Invalid("moe_intermediate_size", "must be > 0");
    if (decoder_sparse_step <= 0) return Invalid("decoder_sparse_step", "must be > 0");
    if (!(router_aux_loss_coef >= 0)) return Invalid("router_aux_loss_coef", "must be >= 0");
  }
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
  const std::string& t = rope.type;
  if (t != "default" && t != "linear" && t != "dynamic" && t != "llama3" && t != "yarn") {
    return Invalid("rope.type", "\"" + t + "\" is not supported (default, linear, dynamic, llama3, yarn)");
  }
  if (t != "default" && !(rope.factor >= 1.0)) return Invalid("rope.factor", absl::StrCat("must be >= 1, got ", rope.factor));
  if (rope.original_max_positions < 0) return Invalid("rope.original_max_positions", "must be >= 0");
  if (t == "llama3" && !(rope.high_freq_factor > rope.low_freq_factor && rope.low_freq_factor > 0)) {
    return Invalid("rope.high_freq_factor", "must be > low_freq_factor > 0");
  }
  if (t == "yarn" && !(rope.beta_fast > 0 && rope.beta_slow > 0)) return Invalid("rope.beta_fast", "beta_fast and beta_slow must be > 0");
  if (rope.attention_factor < 0) return Invalid("rope.attention_factor", "must be >= 0");
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
  } else if (model_type == "qwen3") {
    c.arch = "qwen3";
    c.qkv_bias = false;
    c.head_dim = 128;  // Qwen3Config's default when config.json has none
  } else if (model_type == "qwen3_moe") {
    c.arch = "qwen3_moe";
    c.qkv_bias = false;
  } else if (model_type == "qwen2_moe") {
    c.arch = "qwen2_moe";
    c.qkv_bias = true;  // Qwen2MoeConfig.qkv_bias's default
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
  if (!(s = ParseRope(j, &c)).ok()) return s;
  if (!(s = GetDouble(j, "rms_norm_eps", &c.rms_norm_eps)).ok()) return s;
  c.tie_embeddings = false;
  if (!(s = GetBool(j, "tie_word_embeddings", &c.tie_embeddings)).ok()) return s;
  if (c.arch == "qwen2_moe") {
    if (!(s = GetBool(j, "qkv_bias", &c.qkv_bias)).ok()) return s;
  } else if (c.arch != "qwen2") {
    if (!(s = GetBool(j, "attention_bias", &c.qkv_bias)).ok()) return s;
    bool mlp_bias = false;
    if (!(s = GetBool(j, "mlp_bias", &mlp_bias)).ok()) return s;
    if (mlp_bias) return absl::InvalidArgumentError("config.json: mlp_bias=true is not supported");
  }
  if (c.arch == "qwen3_moe") {
    // Qwen3MoeConfig's defaults for what config.json leaves out.
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = 768;
  } else if (c.arch == "qwen2_moe") {
    // Qwen2MoeConfig's.
    c.num_experts = 60;
    c.num_experts_per_tok = 4;
    c.moe_intermediate_size = 1408;
    c.shared_expert_intermediate_size = 5632;
    if (!(s = GetInt(j, "shared_expert_intermediate_size", &c.shared_expert_intermediate_size)).ok()) return s;
  }
  if (c.IsMoeArch()) {
    // The Hub's configs say num_experts; transformers 5 writes num_local_experts.
    if (!(s = GetInt(j, "num_experts", &c.num_experts)).ok()) return s;
    if (!(s = GetInt(j, "num_local_experts", &c.num_experts)).ok()) return s;
    if (!(s = GetInt(j, "num_experts_per_tok", &c.num_experts_per_tok)).ok()) return s;
    if (!(s = GetInt(j, "moe_intermediate_size", &c.moe_intermediate_size)).ok()) return s;
    if (!(s = GetInt(j, "decoder_sparse_step", &c.decoder_sparse_step)).ok()) return s;
    if (!(s = GetBool(j, "norm_topk_prob", &c.norm_topk_prob)).ok()) return s;
    if (!(s = GetDouble(j, "router_aux_loss_coef", &c.router_aux_loss_coef)).ok()) return s;
    if (!(s = GetBool(j, "output_router_logits", &c.output_router_logits)).ok()) return s;
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      if (!it->is_array()) return absl::InvalidArgumentError("config.json: \"mlp_only_layers\" must be a list");
      for (const auto& l : *it) {
        if (!l.is_number_integer()) return absl::InvalidArgumentError("config.json: \"mlp_only_layers\" must hold integers");
        c.mlp_only_layers.push_back(l.get<int64_t>());
      }
    }
  }
  if (c.arch != "qwen2_moe" && j.contains("shared_expert_intermediate_size")) {
    return absl::InvalidArgumentError(
        "config.json: shared experts (shared_expert_intermediate_size) are supported for qwen2_moe only");
  }
  if (c.arch != "llama") {
    bool sliding = false;
    if (!(s = GetBool(j, "use_sliding_window", &sliding)).ok()) return s;
    if (sliding) return absl::InvalidArgumentError("config.json: use_sliding_window=true is not supported");
  }
  if (auto it = j.find("layer_types"); it != j.end() && it->is_array()) {
    for (const auto& t : *it) {
      if (!t.is_string() || t.get<std::string>() != "full_attention") {
        return absl::InvalidArgumentError(absl::StrCat("config.json: layer_types entry ", t.dump(),
                                                       " is not supported (only \"full_attention\")"));
      }
    }
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
  std::string base = qwen                 ? "Qwen2"
                     : arch == "qwen3"     ? "Qwen3"
                     : arch == "qwen3_moe" ? "Qwen3Moe"
                     : arch == "qwen2_moe" ? "Qwen2Moe"
                                           : "Llama";
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
  j["rope_parameters"] = RopeJson(*this);
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_embeddings;
  j["hidden_act"] = "silu";
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  if (arch != "llama") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  if (arch == "qwen2_moe") {
    j["qkv_bias"] = qkv_bias;  // Qwen2MoeConfig's spelling; never an o bias
  } else if (!qwen) {
    // Qwen2 always has q/k/v bias; the flag is implied by the model type.
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = false;
  }
  if (arch == "qwen2_moe") j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
  if (IsMoeArch()) {
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["mlp_only_layers"] = mlp_only_layers;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
    j["output_router_logits"] = output_router_logits;
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
