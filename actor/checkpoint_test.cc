// Parity with transformers (logits, greedy tokens, our writer read back by
// transformers) and safetensors error handling.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <torch/torch.h>

#include "actor/checkpoint.h"
#include "actor/generate.h"
#include "actor/safetensors.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"

namespace rlmesh::actor {
namespace {

std::string Python() {
  const char* p = std::getenv("RLMESH_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

std::string Script() { return testing::Runfile("actor/testdata/make_golden.py"); }

bool Contains(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

// Every family and RoPE scaling type make_golden.py builds.
const char* kModels[] = {"llama_gqa_untied",     "llama_mha_tied",       "qwen2_gqa_tied",    "qwen2_untied",
                         "llama_attention_bias", "qwen3_headdim_untied", "qwen3_bias_tied",   "llama_rope_linear",
                         "llama_rope_dynamic",   "llama_rope_llama3",    "qwen3_rope_yarn",   "llama_rope_yarn_mscale",
                         "qwen3_moe_norm",       "qwen3_moe_sparse_step", "qwen2_moe_shared", "qwen2_moe_nobias_norm"};

torch::Tensor Positions(const torch::Tensor& ids) {
  return torch::arange(ids.size(1)).unsqueeze(0).expand_as(ids).contiguous();
}

TEST_CASE("Parity with transformers: logits, greedy tokens, and our writer read back") {
  testing::TempDir dir;
  REQUIRE(std::system((Python() + " " + Script() + " models " + dir.path()).c_str()) == 0);
  std::string check_args;  // folders we wrote, for transformers to read back
  for (const std::string name : kModels) {
    INFO("model " << name);
    const std::string folder = dir.File(name);
    auto model = LoadHfModel(folder);
    INFO("load: " << model.status().message());
    REQUIRE(model.ok());
    auto golden = SafetensorsFile::Open(folder + "/golden_logits.safetensors");
    REQUIRE(golden.ok());
    auto ids = *(*golden)->Read("input_ids");
    auto want = *(*golden)->Read("logits");
    torch::Tensor got;
    {
      torch::NoGradGuard g;
      got = (*model)->Forward(ids, Positions(ids));
    }
    const float diff = (got - want).abs().max().item<float>();
    INFO("max |logit diff| " << diff << " (logit scale " << want.abs().max().item<float>() << ")");
    CHECK(diff <= 1e-4f);
    CHECK(want.abs().max().item<float>() > 1.0f);  // the comparison is not of near-zero logits
    if ((*model)->config().IsMoeArch()) {
      // The router's load-balancing loss over the same tokens.
      MoeRouting routing;
      routing.record = true;
      (*model)->set_routing(&routing);
      torch::NoGradGuard g;
      (*model)->Forward(ids, Positions(ids));
      (*model)->set_routing(nullptr);
      const ModelConfig& mc = (*model)->config();
      REQUIRE(static_cast<int64_t>(routing.router_logits.size()) == mc.NumMoeLayers());
      auto aux = LoadBalancingLoss(routing.router_logits, mc.num_experts, mc.num_experts_per_tok);
      auto want_aux = *(*golden)->Read("aux_loss");
      INFO("aux loss " << aux.item<float>() << " vs " << want_aux.item<float>());
      CHECK(std::abs(aux.item<float>() - want_aux.item<float>()) < 1e-5f);
    }
    if (name.find("rope_") != std::string::npos) {
      // The golden lengths reach where the scaling matters: the same weights
      // with plain RoPE would not pass.
      ModelConfig plain = (*model)->config();
      REQUIRE(plain.rope.type != "default");
      plain.rope = RopeScaling();
      Transformer unscaled(plain);
      torch::NoGradGuard g;
      auto src = (*model)->NamedParameters();
      auto dst = unscaled->NamedParameters();
      REQUIRE(src.size() == dst.size());
      for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
      CHECK((unscaled->Forward(ids, Positions(ids)) - want).abs().max().item<float>() > 1e-2f);
    }

    std::ifstream in(folder + "/golden_greedy.json");
    auto j = nlohmann::json::parse(in);
    std::vector<GenerationRequest> reqs;
    for (const auto& p : j["prompts"]) {
      GenerationRequest r;
      r.prompt = p.get<std::vector<int64_t>>();
      r.sampling.greedy = true;
      r.sampling.max_new_tokens = j["max_new_tokens"].get<int>();
      reqs.push_back(r);
    }
    Generator gen(*model, {.max_batch = 8});
    auto res = gen.Generate(reqs);
    REQUIRE(res.ok());
    for (size_t i = 0; i < reqs.size(); ++i) {
      CHECK((*res)[i].samples[0].tokens == j["greedy"][i].get<std::vector<int64_t>>());
    }

    // Our writer: single file, and sharded; transformers must read both back.
    for (int64_t shard : {int64_t{0}, int64_t{20000}}) {
      const std::string out = dir.File(name + "_ours_" + std::to_string(shard));
      REQUIRE(SaveHfModel(*model, out, {.dtype = "fp32", .max_shard_bytes = shard}).ok());
      CHECK(std::filesystem::exists(out + (shard ? "/model.safetensors.index.json" : "/model.safetensors")));
      REQUIRE(WriteSafetensors(out + "/ours.safetensors", {{"input_ids", ids}, {"logits", got}}).ok());
      check_args += " " + out + " " + out + "/ours.safetensors";
      auto back = LoadHfModel(out);
      REQUIRE(back.ok());
      torch::NoGradGuard g;
      CHECK(torch::equal((*back)->Forward(ids, Positions(ids)), got));
    }
  }
  // One Python process reads every folder (the log names each one's diff).
  CHECK(std::system((Python() + " " + Script() + " check" + check_args).c_str()) == 0);
}

TEST_CASE("bf16 and fp16 round trips store exactly the rounded weights") {
  testing::TempDir dir;
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 1;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.arch = "qwen2";
  torch::manual_seed(3);
  Transformer m(c);
  for (const std::string dtype : {"bf16", "fp16"}) {
    INFO(dtype);
    const auto st = *ParseDtype(dtype);
    REQUIRE(SaveHfModel(m, dir.File(dtype), {.dtype = dtype}).ok());
    auto f = SafetensorsFile::Open(dir.File(dtype) + "/model.safetensors");
    REQUIRE(f.ok());
    CHECK((*f)->Find("model.embed_tokens.weight")->dtype == (dtype == "bf16" ? "BF16" : "F16"));
    auto fp32 = LoadHfModel(dir.File(dtype));
    REQUIRE(fp32.ok());
    auto native = LoadHfModel(dir.File(dtype), {.dtype = dtype});
    REQUIRE(native.ok());
    auto a = m->NamedParameters();
    auto b = (*fp32)->NamedParameters();
    auto n = (*native)->NamedParameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(torch::equal(a[i].second.to(st).to(torch::kFloat32), b[i].second));
      CHECK(n[i].second.scalar_type() == st);
      CHECK(torch::equal(a[i].second.to(st), n[i].second));
    }
    std::ifstream cfg(dir.File(dtype) + "/config.json");
    auto j = nlohmann::json::parse(cfg);
    CHECK(j["torch_dtype"] == (dtype == "bf16" ? "bfloat16" : "float16"));
  }
}

TEST_CASE("A folder we write opens in transformers with its tokenizer: same ids, decodings and logits") {
  testing::TempDir dir;
  // The BPE tokenizer comes from PyPI tokenizers (trained by make_golden.py).
  REQUIRE(std::system((Python() + " " + Script() + " tokenizers " + dir.path() + " > /dev/null").c_str()) == 0);
  // A tokenizer folder with a chat template beside it: the template travels
  // into the folders we write.
  const std::string chat = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
  std::filesystem::create_directories(dir.File("bpe_src"));
  std::filesystem::copy_file(dir.File("qwen2_tokenizer.json"), dir.File("bpe_src/tokenizer.json"));
  // The tokens named as transformers writes them (AddedToken objects, null).
  std::ofstream(dir.File("bpe_src/tokenizer_config.json"))
      << nlohmann::json({{"tokenizer_class", "PreTrainedTokenizerFast"},
                         {"chat_template", chat},
                         {"bos_token", nullptr},
                         {"eos_token",
                          {{"__type", "AddedToken"}, {"content", "<|im_end|>"}, {"lstrip", false},
                           {"normalized", false}, {"rstrip", false}, {"single_word", false}, {"special", true}}},
                         {"pad_token", "<|endoftext|>"}})
             .dump();
  auto bpe = LoadTokenizer(dir.File("bpe_src"));
  REQUIRE(bpe.ok());
  CHECK((*bpe)->chat_template() == chat);
  auto chr = LoadTokenizer("char");
  REQUIRE(chr.ok());
  const std::vector<std::string> texts = {"12+34=46", "Tom has 3 apples. He eats 1!", "a  b\n\nc", "x*(y-2)/7 ?",
                                          "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac", ""};
  for (const auto* tok : {chr->get(), bpe->get()}) {
    const bool is_char = tok == chr->get();
    INFO((is_char ? "char" : "bpe") << " tokenizer");
    ModelConfig c;
    c.arch = is_char ? "llama" : "qwen3";
    c.vocab_size = tok->vocab_size();
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_layers = 1;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.max_positions = 64;
    c.bos_token_id = tok->bos_id();
    c.eos_token_id = tok->eos_id();
    c.pad_token_id = tok->pad_id();
    if (!is_char) {
      CHECK(tok->eos_id() == tok->TokenId("<|im_end|>"));
      CHECK(tok->pad_id() == tok->TokenId("<|endoftext|>"));
      CHECK(tok->bos_id() == -1);
    }
    torch::manual_seed(11);
    Transformer m(c);
    {
      torch::NoGradGuard g;
      for (auto& p : m->parameters()) p.normal_(0, 0.3);
    }
    const std::string out = dir.File(is_char ? "char_model" : "bpe_model");
    REQUIRE(SaveHfModel(m, out, {.tokenizer = tok}).ok());
    CHECK(std::filesystem::exists(out + "/tokenizer.json"));
    CHECK(std::filesystem::exists(out + "/tokenizer_config.json"));
    CHECK(std::filesystem::exists(out + "/generation_config.json"));
    // The folder is also a tokenizer spec for us, giving the same tokenizer.
    auto again = LoadTokenizer(out);
    REQUIRE(again.ok());
    CHECK((*again)->Hash() == tok->Hash());
    CHECK((dynamic_cast<const CharTokenizer*>(again->get()) != nullptr) == is_char);

    nlohmann::json ours;
    ours["texts"] = texts;
    for (const auto& t : texts) {
      auto ids = tok->Encode(t);
      ours["ids"].push_back(ids);
      ours["decoded"].push_back(tok->Decode(ids, /*skip_special=*/true));
    }
    auto opt = [](int64_t id) { return id >= 0 ? nlohmann::json(id) : nlohmann::json(nullptr); };
    ours["eos_token_id"] = opt(c.eos_token_id);
    ours["pad_token_id"] = opt(c.pad_token_id);
    ours["bos_token_id"] = opt(c.bos_token_id);
    ours["chat_template"] = is_char ? nlohmann::json(nullptr) : nlohmann::json(chat);
    auto ids = torch::tensor(tok->Encode(texts[1]), torch::kLong).unsqueeze(0);
    torch::Tensor logits;
    {
      torch::NoGradGuard g;
      logits = m->Forward(ids, Positions(ids));
    }
    ours["logits"] = out + "/ours_logits.safetensors";
    REQUIRE(WriteSafetensors(out + "/ours_logits.safetensors", {{"input_ids", ids}, {"logits", logits}}).ok());
    {
      std::ofstream f(out + "/ours.json");
      f << ours.dump();
    }
    CHECK(std::system((Python() + " " + Script() + " hfload " + out + " " + out + "/ours.json").c_str()) == 0);
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST_CASE("generation_config.json is the tokenizer folder's own but for eos_token_id, else the model config's") {
  testing::TempDir dir;
  auto folder = [&](const std::string& name, const std::string& generation_config) {
    const std::string f = dir.File(name);
    std::filesystem::create_directories(f);
    std::ofstream(f + "/tokenizer.json")
        << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
               "added_tokens": [{"id": 2, "content": "<|begin|>", "special": true},
                                {"id": 3, "content": "<|end|>", "special": true},
                                {"id": 4, "content": "<|eot|>", "special": true}]})";
    std::ofstream(f + "/tokenizer_config.json") << R"({"eos_token": "<|end|>"})";
    if (!generation_config.empty()) std::ofstream(f + "/generation_config.json") << generation_config;
    return f;
  };
  ModelConfig c;
  c.vocab_size = 5;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.max_positions = 16;
  c.bos_token_id = 2;
  c.eos_token_id = 3;
  Transformer m(c);
  auto saved = [&](const Tokenizer* tok, const std::string& name) {
    REQUIRE(SaveHfModel(m, dir.File(name), {.tokenizer = tok}).ok());
    return nlohmann::json::parse(ReadAll(dir.File(name + "/generation_config.json")));
  };

  auto own = LoadTokenizer(folder("own_src", R"({"eos_token_id": [4, 3], "temperature": 0.6, "top_k": 7})"));
  REQUIRE(own.ok());
  CHECK(saved(own->get(), "own") ==
        nlohmann::json({{"eos_token_id", {4, 3}}, {"temperature", 0.6}, {"top_k", 7}}));

  auto none = LoadTokenizer(folder("none_src", ""));
  REQUIRE(none.ok());
  CHECK(saved(none->get(), "none") ==
        nlohmann::json({{"_from_model_config", true}, {"bos_token_id", 2}, {"eos_token_id", 3}}));
}

TEST_CASE("safetensors errors name the tensor or the byte offset") {
  testing::TempDir dir;
  const std::string good = dir.File("good.safetensors");
  REQUIRE(WriteSafetensors(good, {{"alpha", torch::arange(6, torch::kFloat32).view({2, 3})},
                                  {"beta", torch::ones({4}, torch::kBFloat16)}})
              .ok());
  auto ok = SafetensorsFile::Open(good);
  REQUIRE(ok.ok());
  CHECK(torch::equal(*(*ok)->Read("alpha"), torch::arange(6, torch::kFloat32).view({2, 3})));
  CHECK((*ok)->Read("gamma").status().code() == absl::StatusCode::kNotFound);
  CHECK(Contains((*ok)->Read("gamma").status(), "gamma"));
  const std::string bytes = ReadAll(good);
  const std::string bad = dir.File("bad.safetensors");

  // Truncated data: the last tensor's end is beyond the file.
  WriteAll(bad, bytes.substr(0, bytes.size() - 3));
  auto s = SafetensorsFile::Open(bad).status();
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(s, "\"beta\""));
  CHECK(Contains(s, "truncated"));

  // Header length beyond the file.
  std::string big = bytes;
  big[5] = '\x7f';
  WriteAll(bad, big);
  s = SafetensorsFile::Open(bad).status();
  CHECK(Contains(s, "header length"));
  CHECK(Contains(s, "bytes 0-7"));

  // Shorter than the length field.
  WriteAll(bad, "abc");
  CHECK(Contains(SafetensorsFile::Open(bad).status(), "8-byte header length"));

  // Corrupt JSON: byte 8 opens the object; break it there.
  std::string corrupt = bytes;
  corrupt[8] = 'x';
  WriteAll(bad, corrupt);
  s = SafetensorsFile::Open(bad).status();
  CHECK(Contains(s, "corrupt header JSON at byte 8"));

  // data_offsets that disagree with the shape.
  std::string hdr = "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}";
  std::string len(8, '\0');
  len[0] = static_cast<char>(hdr.size());
  WriteAll(bad, len + hdr + std::string(8, '\0'));
  s = SafetensorsFile::Open(bad).status();
  CHECK(Contains(s, "\"t\""));
  CHECK(Contains(s, "shape needs 12"));

  // Unknown dtype.
  hdr = "{\"t\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  len[0] = static_cast<char>(hdr.size());
  WriteAll(bad, len + hdr + std::string(1, '\0'));
  CHECK(Contains(SafetensorsFile::Open(bad).status(), "Q4"));
}

TEST_CASE("A streamed safetensors file equals the one written at once; its misuse is refused by name") {
  testing::TempDir dir;
  const auto alpha = torch::arange(6, torch::kFloat32).view({2, 3});
  const auto beta = torch::linspace(-1, 1, 5, torch::kFloat32);
  const auto gamma = torch::arange(4, torch::kFloat32);
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  const std::string whole = dir.File("whole.safetensors");
  // beta stored as bf16: the writer converts what it is given.
  REQUIRE(WriteSafetensors(whole, {{"alpha", alpha}, {"beta", beta.to(torch::kBFloat16)}, {"gamma", gamma}}, meta)
              .ok());
  const std::vector<SafetensorsSpec> specs = {{"alpha", torch::kFloat32, {2, 3}},
                                              {"beta", torch::kBFloat16, {5}},
                                              {"gamma", torch::kFloat32, {4}}};
  const std::string streamed = dir.File("streamed.safetensors");
  {
    auto w = SafetensorsWriter::Open(streamed, specs, meta);
    REQUIRE(w.ok());
    REQUIRE((*w)->AppendTensor("alpha", alpha).ok());
    // Parts of any size, across tensor boundaries: beta's 5 and gamma's 4.
    REQUIRE((*w)->AppendPart(beta.narrow(0, 0, 2)).ok());
    REQUIRE((*w)->AppendPart(torch::cat({beta.narrow(0, 2, 3), gamma.narrow(0, 0, 1)})).ok());
    CHECK(!std::filesystem::exists(streamed));  // nothing before Commit
    REQUIRE((*w)->AppendPart(gamma.narrow(0, 1, 3)).ok());
    REQUIRE((*w)->Commit().ok());
  }
  CHECK(ReadAll(streamed) == ReadAll(whole));

  const std::string bad = dir.File("bad.safetensors");
  auto open = [&] {
    auto w = SafetensorsWriter::Open(bad, specs, meta);
    REQUIRE(w.ok());
    return std::move(*w);
  };
  {
    auto w = open();
    auto s = w->AppendTensor("beta", beta);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(s, "\"beta\" out of order; the next is \"alpha\""));
    CHECK(!w->Commit().ok());  // an error finishes the writer
  }
  {
    auto w = open();
    CHECK(Contains(w->AppendTensor("alpha", torch::zeros({3, 2})), "expected shape [2, 3], got [3, 2]"));
  }
  {
    auto w = open();
    REQUIRE(w->AppendTensor("alpha", alpha).ok());
    auto s = w->Commit();
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Contains(s, "\"beta\" has 0 of its 5 elements"));
  }
  {
    auto w = open();
    CHECK(Contains(w->AppendPart(torch::zeros({16})), "1 elements past the last tensor"));
  }
  CHECK(!std::filesystem::exists(bad));  // no partial file from any of them
  CHECK(Contains(SafetensorsWriter::Open(bad, {{"a", torch::kFloat32, {1}}, {"a", torch::kFloat32, {1}}}).status(),
                 "\"a\" appears twice"));
  CHECK(Contains(SafetensorsWriter::Open(bad, {{"__metadata__", torch::kFloat32, {1}}}).status(), "reserved"));
}

TEST_CASE("ReadFlatRange: a range of a tensor laid flat, in its stored dtype; outside ranges are refused") {
  testing::TempDir dir;
  const auto alpha = torch::arange(6, torch::kFloat32).view({2, 3});
  const auto beta = torch::linspace(-1, 1, 5, torch::kFloat32).to(torch::kBFloat16);
  const std::string path = dir.File("t.safetensors");
  REQUIRE(WriteSafetensors(path, {{"alpha", alpha}, {"beta", beta}}).ok());
  auto f = SafetensorsFile::Open(path);
  REQUIRE(f.ok());
  auto mid = (*f)->ReadFlatRange("alpha", 2, 3);  // across the row boundary
  REQUIRE(mid.ok());
  CHECK(torch::equal(*mid, alpha.reshape({-1}).narrow(0, 2, 3)));
  auto tail = (*f)->ReadFlatRange("beta", 3, 2);
  REQUIRE(tail.ok());
  CHECK(tail->scalar_type() == torch::kBFloat16);
  CHECK(torch::equal(*tail, beta.narrow(0, 3, 2)));
  auto none = (*f)->ReadFlatRange("alpha", 6, 0);
  REQUIRE(none.ok());
  CHECK(none->numel() == 0);
  for (auto [begin, count] : {std::pair<int64_t, int64_t>{5, 2}, {-1, 1}, {0, -1}, {7, 0}}) {
    auto bad = (*f)->ReadFlatRange("alpha", begin, count);
    CHECK(bad.status().code() == absl::StatusCode::kOutOfRange);
    CHECK(bad.status().message().find("alpha") != std::string::npos);
  }
  CHECK((*f)->ReadFlatRange("gamma", 0, 1).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("Folder errors: missing tensor and shape mismatch are named") {
  testing::TempDir dir;
  ModelConfig c;
  c.vocab_size = 30;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  torch::manual_seed(0);
  Transformer m(c);
  REQUIRE(SaveHfModel(m, dir.path()).ok());
  // Drop one tensor.
  std::vector<std::pair<std::string, torch::Tensor>> keep;
  for (auto& [n, p] : m->NamedParameters()) {
    if (n != "model.layers.1.mlp.up_proj.weight") keep.emplace_back(n, p);
  }
  REQUIRE(WriteSafetensors(dir.File("model.safetensors"), keep).ok());
  auto s = LoadHfModel(dir.path()).status();
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(s, "model.layers.1.mlp.up_proj.weight"));
  // Shape mismatch: a config that disagrees with the weights.
  REQUIRE(SaveHfModel(m, dir.path()).ok());
  ModelConfig wider = c;
  wider.vocab_size = 31;
  Transformer w(wider);
  s = LoadHfWeights(dir.path(), w);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(s, "model.embed_tokens.weight"));
  CHECK(Contains(s, "[30, 16]"));
  // Critic from a policy: value head may be missing when allowed.
  CHECK_FALSE(LoadHfModel(dir.path(), {.add_value_head = true}).ok());
  auto critic = LoadHfModel(dir.path(), {.add_value_head = true, .allow_missing_value_head = true});
  REQUIRE(critic.ok());
  CHECK((*critic)->config().value_head);
  CHECK(LoadHfModel(dir.path(), {.dtype = "int8"}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(LoadHfModel(dir.File("nope")).status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rlmesh::actor
