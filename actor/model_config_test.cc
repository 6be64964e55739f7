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

}  // namespace
}  // namespace rlmesh::actor
