#include "actor/model_config.h"

#include "catch2/catch.hpp"

namespace rlmesh::actor {
namespace {

TEST_CASE("ModelConfig validates each field by name") {
  ModelConfig c;
  REQUIRE(c.Validate().ok());
  c.num_kv_heads = 3;
  auto s = c.Validate();
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(std::string(s.message()).find("num_kv_heads") != std::string::npos);
  c = ModelConfig();
  c.arch = "gpt2";
  REQUIRE(std::string(c.Validate().message()).find("arch") != std::string::npos);
  c = ModelConfig();
  c.eos_token_id = c.vocab_size;
  REQUIRE(std::string(c.Validate().message()).find("eos_token_id") != std::string::npos);
}

TEST_CASE("ModelConfig round-trips through config.json") {
  ModelConfig c;
  c.arch = "qwen2";
  c.vocab_size = 151;
  c.hidden_size = 96;
  c.intermediate_size = 200;
  c.num_layers = 3;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.rope_theta = 1e6;
  c.rms_norm_eps = 1e-5;
  c.tie_embeddings = true;
  c.eos_token_id = 5;
  auto back = ModelConfig::FromHfConfigJsonString(c.ToHfConfigJson());
  REQUIRE(back.ok());
  CHECK(back->arch == "qwen2");
  CHECK(back->HasQkvBias());
  CHECK(back->vocab_size == 151);
  CHECK(back->hidden_size == 96);
  CHECK(back->intermediate_size == 200);
  CHECK(back->num_layers == 3);
  CHECK(back->num_heads == 6);
  CHECK(back->num_kv_heads == 2);
  CHECK(back->rope_theta == 1e6);
  CHECK(back->rms_norm_eps == 1e-5);
  CHECK(back->tie_embeddings);
  CHECK(back->eos_token_id == 5);
  CHECK(back->bos_token_id == -1);
}

TEST_CASE("ModelConfig reads transformers 4.x spelling and rejects what it cannot run") {
  const char* v4 = R"({"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 8, "rope_theta": 500000.0,
    "eos_token_id": [3, 4], "attention_bias": true})";
  auto c = ModelConfig::FromHfConfigJsonString(v4);
  REQUIRE(c.ok());
  CHECK(c->rope_theta == 500000.0);
  CHECK(c->num_kv_heads == 2);  // defaults to num_attention_heads
  CHECK(c->eos_token_id == 3);
  CHECK(c->qkv_bias);
  CHECK_FALSE(ModelConfig::FromHfConfigJsonString("{not json").ok());
  auto missing = ModelConfig::FromHfConfigJsonString(R"({"model_type": "llama"})");
  REQUIRE_FALSE(missing.ok());
  CHECK(std::string(missing.status().message()).find("vocab_size") != std::string::npos);
  std::string scaled = std::string(v4);
  scaled.insert(scaled.size() - 1, R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0})");
  CHECK_FALSE(ModelConfig::FromHfConfigJsonString(scaled).ok());
  CHECK_FALSE(ModelConfig::FromHfConfigJsonString(R"({"model_type": "gpt2"})").ok());
  // Wrong JSON types are errors, not exceptions.
  CHECK_FALSE(ModelConfig::FromHfConfigJsonString(R"({"model_type": 3})").ok());
}

TEST_CASE("ModelConfig reads Qwen3: QK-norm, explicit head_dim, attention_bias on q/k/v and o") {
  const char* q3 = R"({"model_type": "qwen3", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 24,
    "max_position_embeddings": 8, "attention_bias": true, "use_sliding_window": false,
    "layer_types": ["full_attention"], "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})";
  auto c = ModelConfig::FromHfConfigJsonString(q3);
  REQUIRE(c.ok());
  CHECK(c->arch == "qwen3");
  CHECK(c->HasQkNorm());
  CHECK(c->HeadDim() == 24);
  CHECK(c->HasQkvBias());
  CHECK(c->HasOBias());
  CHECK(c->rope_theta == 1e6);
  auto back = ModelConfig::FromHfConfigJsonString(c->ToHfConfigJson());
  REQUIRE(back.ok());
  CHECK(back->arch == "qwen3");
  CHECK(back->HeadDim() == 24);
  CHECK(back->HasOBias());
  // Qwen3Config's head_dim default is 128, not hidden / heads.
  std::string no_head_dim = q3;
  no_head_dim.replace(no_head_dim.find(R"("head_dim": 24,)"), 15, "");
  auto d = ModelConfig::FromHfConfigJsonString(no_head_dim);
  REQUIRE(d.ok());
  CHECK(d->HeadDim() == 128);
  // Qwen2 keeps q/k/v bias without o bias; Llama's attention_bias covers o.
  ModelConfig q2;
  q2.arch = "qwen2";
  CHECK(q2.HasQkvBias());
  CHECK_FALSE(q2.HasOBias());
  CHECK_FALSE(q2.HasQkNorm());
  std::string sliding = q3;
  sliding.replace(sliding.find(R"("use_sliding_window": false)"), 27, R"("use_sliding_window": true)");
  auto s = ModelConfig::FromHfConfigJsonString(sliding);
  REQUIRE_FALSE(s.ok());
  CHECK(std::string(s.status().message()).find("use_sliding_window") != std::string::npos);
  std::string layer_types = q3;
  layer_types.replace(layer_types.find(R"(["full_attention"])"), 18, R"(["sliding_attention"])");
  auto lt = ModelConfig::FromHfConfigJsonString(layer_types);
  REQUIRE_FALSE(lt.ok());
  CHECK(std::string(lt.status().message()).find("sliding_attention") != std::string::npos);
}

TEST_CASE("ModelConfig reads Qwen3-MoE: experts, top-k, sparse layers; refuses shared experts by name") {
  const std::string moe = R"({"model_type": "qwen3_moe", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 4, "num_attention_heads": 2, "max_position_embeddings": 8, "num_experts": 6,
    "num_experts_per_tok": 2, "moe_intermediate_size": 8, "norm_topk_prob": true, "decoder_sparse_step": 2,
    "mlp_only_layers": [3], "router_aux_loss_coef": 0.01})";
  auto c = ModelConfig::FromHfConfigJsonString(moe);
  REQUIRE(c.ok());
  CHECK(c->arch == "qwen3_moe");
  CHECK(c->HasQkNorm());
  CHECK(c->HeadDim() == 8);  // hidden / heads: Qwen3MoeConfig has no 128 default
  CHECK(c->num_experts == 6);
  CHECK(c->num_experts_per_tok == 2);
  CHECK(c->norm_topk_prob);
  CHECK(c->router_aux_loss_coef == 0.01);
  // Layer i is MoE when (i+1) % 2 == 0 and i is not in mlp_only_layers.
  CHECK_FALSE(c->IsMoeLayer(0));
  CHECK(c->IsMoeLayer(1));
  CHECK_FALSE(c->IsMoeLayer(2));
  CHECK_FALSE(c->IsMoeLayer(3));
  CHECK(c->NumMoeLayers() == 1);
  auto back = ModelConfig::FromHfConfigJsonString(c->ToHfConfigJson());
  REQUIRE(back.ok());
  CHECK(back->num_experts == 6);
  CHECK(back->moe_intermediate_size == 8);
  CHECK(back->decoder_sparse_step == 2);
  CHECK(back->mlp_only_layers == std::vector<int64_t>{3});
  std::string shared = moe;
  shared.insert(shared.size() - 1, R"(, "shared_expert_intermediate_size": 8)");
  auto s = ModelConfig::FromHfConfigJsonString(shared);
  REQUIRE_FALSE(s.ok());
  CHECK(std::string(s.status().message()).find("shared_expert") != std::string::npos);
  std::string topk = moe;
  topk.replace(topk.find(R"("num_experts_per_tok": 2)"), 24, R"("num_experts_per_tok": 7)");
  auto t = ModelConfig::FromHfConfigJsonString(topk);
  REQUIRE_FALSE(t.ok());
  CHECK(std::string(t.status().message()).find("num_experts_per_tok") != std::string::npos);
  ModelConfig dense;
  dense.num_experts = 4;
  CHECK(std::string(dense.Validate().message()).find("num_experts") != std::string::npos);
}

TEST_CASE("ModelConfig reads every RoPE scaling type in both spellings and refuses the rest by name") {
  const std::string head = R"({"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
    "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 64, "rope_theta": 500000.0, )";
  // transformers 4.x: rope_scaling next to a top-level rope_theta.
  auto v4 = ModelConfig::FromHfConfigJsonString(head + R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}})");
  REQUIRE(v4.ok());
  CHECK(v4->rope.type == "llama3");
  CHECK(v4->rope.factor == 8.0);
  CHECK(v4->rope.original_max_positions == 16);
  CHECK(v4->rope_theta == 500000.0);
  // 4.x "type" spelling.
  auto lin = ModelConfig::FromHfConfigJsonString(head + R"("rope_scaling": {"type": "linear", "factor": 2.0}})");
  REQUIRE(lin.ok());
  CHECK(lin->rope.type == "linear");
  // 5.x: rope_parameters carries the theta; yarn's optional keys.
  auto yarn = ModelConfig::FromHfConfigJsonString(head + R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4,
    "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8, "beta_slow": 2, "mscale": 0.7,
    "mscale_all_dim": 0.5, "truncate": false}})");
  REQUIRE(yarn.ok());
  CHECK(yarn->rope_theta == 1e4);
  CHECK(yarn->rope.beta_fast == 8);
  CHECK(yarn->rope.beta_slow == 2);
  CHECK(yarn->rope.mscale == 0.7);
  CHECK(yarn->rope.mscale_all_dim == 0.5);
  CHECK_FALSE(yarn->rope.truncate);
  // What we write reads back the same.
  auto back = ModelConfig::FromHfConfigJsonString(yarn->ToHfConfigJson());
  REQUIRE(back.ok());
  CHECK(back->rope.type == "yarn");
  CHECK(back->rope.factor == 4.0);
  CHECK(back->rope.original_max_positions == 16);
  CHECK(back->rope.beta_fast == 8);
  CHECK(back->rope.mscale_all_dim == 0.5);
  CHECK_FALSE(back->rope.truncate);
  auto dyn = ModelConfig::FromHfConfigJsonString(head + R"("rope_parameters": {"rope_type": "dynamic", "factor": 2}})");
  REQUIRE(dyn.ok());
  CHECK(dyn->rope.type == "dynamic");
  CHECK(dyn->rope_theta == 500000.0);  // the top-level theta when the dictionary has none

  auto refused = [&](const std::string& rope, const std::string& part) {
    auto r = ModelConfig::FromHfConfigJsonString(head + rope + "}");
    INFO(rope);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message());
    CHECK(std::string(r.status().message()).find(part) != std::string::npos);
  };
  refused(R"("rope_parameters": {"rope_type": "longrope", "short_factor": [1], "long_factor": [1]})", "longrope");
  refused(R"("rope_scaling": {"type": "su"})", "\"su\"");
  refused(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})", "low_freq_factor");
  refused(R"("rope_parameters": {"rope_type": "linear"})", "factor");
  refused(R"("rope_parameters": {"rope_type": "linear", "factor": 0.5})", "rope.factor");
  refused(R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})", "partial_rotary_factor");
  refused(R"("rope_parameters": {"full_attention": {"rope_type": "default"}})", "full_attention");
  refused(R"("rope_scaling": "linear")", "rope_scaling");
}

}  // namespace
}  // namespace rlmesh::actor
