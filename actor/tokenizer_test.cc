#include "actor/tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <fstream>
#include <sstream>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"

namespace rlmesh::actor {
namespace {

std::string Python() {
  const char* p = std::getenv("RLMESH_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

TEST_CASE("CharTokenizer encodes the task alphabet and round-trips") {
  CharTokenizer t;
  CHECK(t.pad_id() == 0);
  CHECK(t.bos_id() == 1);
  CHECK(t.eos_id() == 2);
  const std::string s = "12+34=46 What is x*(y-3)? Answer: 7\n";
  auto ids = t.Encode(s);
  REQUIRE(ids.size() == s.size());
  for (int id : ids) CHECK(id >= 4);
  CHECK(t.Decode(ids) == s);
  CHECK(t.Encode("é")[0] == t.unk_id());
  CHECK(t.Encode("aé b").size() == 4);
  std::vector<int> with_special = {t.bos_id(), ids[0], t.eos_id()};
  CHECK(t.Decode(with_special) == "<bos>1<eos>");
  CHECK(t.Decode(with_special, /*skip_special=*/true) == "1");
  CHECK(t.TokenId("<eos>") == 2);
  CHECK(t.Hash() == CharTokenizer().Hash());
  CHECK(t.Hash().size() == 64);
}

TEST_CASE("BpeTokenizer rejects malformed and unsupported files by name") {
  auto bad = BpeTokenizer::FromJson("{\"model\": ");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("byte") != std::string::npos);
  auto wp = BpeTokenizer::FromJson(R"({"model": {"type": "WordPiece", "vocab": {}}})");
  REQUIRE_FALSE(wp.ok());
  CHECK(std::string(wp.status().message()).find("model.type") != std::string::npos);
  auto pre = BpeTokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                        "pre_tokenizer": {"type": "Whitespace"}})");
  REQUIRE_FALSE(pre.ok());
  CHECK(std::string(pre.status().message()).find("Whitespace") != std::string::npos);
  auto types = BpeTokenizer::FromJson(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                          "added_tokens": [{"id": "x", "content": 5}]})");
  CHECK(types.status().code() == absl::StatusCode::kInvalidArgument);
}

// Tokenizers trained by PyPI `tokenizers` on varied text; the held-out ids
// are the reference's.
TEST_CASE("BpeTokenizer matches tokenizers on held-out text") {
  testing::TempDir dir;
  std::string cmd = Python() + " " + testing::Runfile("actor/testdata/make_golden.py") + " tokenizers " + dir.path();
  REQUIRE(std::system(cmd.c_str()) == 0);
  for (const std::string name : {"gpt2", "qwen2", "llama3"}) {
    INFO("tokenizer " << name);
    auto tok = BpeTokenizer::FromFile(dir.File(name + "_tokenizer.json"));
    REQUIRE(tok.ok());
    std::ifstream in(dir.File(name + "_heldout.json"));
    auto j = nlohmann::json::parse(in);
    CHECK((*tok)->vocab_size() == j["vocab_size"].get<int>());
    // tokenizer.json alone names no special token: none is guessed.
    CHECK((*tok)->eos_id() == -1);
    CHECK((*tok)->stop_ids().empty());
    const auto& texts = j["texts"];
    const auto& want = j["ids"];
    const auto& decoded = j["decoded"];
    int mismatches = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      std::string text = texts[i].get<std::string>();
      auto ids = (*tok)->Encode(text);
      auto expect = want[i].get<std::vector<int>>();
      if (ids != expect) {
        ++mismatches;
        UNSCOPED_INFO("mismatch on text #" << i << ": " << nlohmann::json(text).dump());
      }
      CHECK((*tok)->Decode(expect) == decoded[i].get<std::string>());
      if (name != "qwen2") CHECK((*tok)->Decode(ids) == text);  // no normalizer: exact round trip
    }
    CHECK(mismatches == 0);
    CHECK(texts.size() > 300);
    // Any ids decode to valid UTF-8, the same text as tokenizers gives.
    int lossy = 0;
    for (size_t i = 0; i < j["random_ids"].size(); ++i) {
      auto got = (*tok)->Decode(j["random_ids"][i].get<std::vector<int>>(), /*skip_special=*/true);
      const std::string want_text = j["random_decoded"][i].get<std::string>();
      INFO("random ids #" << i);
      CHECK(got == want_text);
      lossy += want_text.find("\xEF\xBF\xBD") != std::string::npos;
    }
    CHECK(lossy > 10);  // the sample does cut characters
  }
}

// A folder's special tokens: tokenizer_config.json (strings or AddedToken
// objects) and generation_config.json's eos_token_id (int or list).
namespace specials {

constexpr char kVocab[] = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
  "added_tokens": [{"id": 2, "content": "<|begin|>", "special": true},
                   {"id": 3, "content": "<|end|>", "special": true},
                   {"id": 4, "content": "<|eot|>", "special": true},
                   {"id": 5, "content": "<|pad|>", "special": true}]})";

std::string Folder(const testing::TempDir& dir, const std::string& name, const std::string& tokenizer_config,
                   const std::string& generation_config) {
  const std::string folder = dir.File(name);
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/tokenizer.json") << kVocab;
  if (!tokenizer_config.empty()) std::ofstream(folder + "/tokenizer_config.json") << tokenizer_config;
  if (!generation_config.empty()) std::ofstream(folder + "/generation_config.json") << generation_config;
  return folder;
}

bool Says(const absl::Status& s, const std::string& what) {
  return std::string(s.message()).find(what) != std::string::npos;
}

TEST_CASE("LoadTokenizer reads stop ids from the folder, never from token names") {
  testing::TempDir dir;
  SECTION("generation_config.json's list, then tokenizer_config.json's eos_token") {
    auto t = LoadTokenizer(Folder(dir, "both", R"({"bos_token": {"__type": "AddedToken", "content": "<|begin|>"},
                                                  "eos_token": "<|end|>", "pad_token": null})",
                                  R"({"eos_token_id": [4, 3], "temperature": 0.6})"));
    REQUIRE(t.ok());
    CHECK((*t)->bos_id() == 2);
    CHECK((*t)->eos_id() == 3);
    CHECK((*t)->pad_id() == 3);  // none named: the eos, as transformers pads
    CHECK((*t)->stop_ids() == std::vector<int>{4, 3});
    CHECK((*t)->special_tokens_source().find("generation_config.json eos_token_id [4,3]") != std::string::npos);
  }
  SECTION("the tokenizer's eos joins generation_config.json's int") {
    auto t = LoadTokenizer(Folder(dir, "int", R"({"eos_token": "<|end|>", "pad_token": "<|pad|>"})",
                                  R"({"eos_token_id": 4, "pad_token_id": 1})"));
    REQUIRE(t.ok());
    CHECK((*t)->stop_ids() == std::vector<int>{4, 3});
    CHECK((*t)->pad_id() == 5);  // tokenizer_config.json's, not generation_config.json's
  }
  SECTION("generation_config.json alone: its first id is the eos") {
    auto t = LoadTokenizer(Folder(dir, "gen_only", "", R"({"eos_token_id": [4, 3], "bos_token_id": 2})"));
    REQUIRE(t.ok());
    CHECK((*t)->eos_id() == 4);
    CHECK((*t)->bos_id() == 2);
    CHECK((*t)->stop_ids() == std::vector<int>{4, 3});
  }
  SECTION("neither file: no stop id, and the source says what was read") {
    const std::string folder = Folder(dir, "bare", "", "");
    auto t = LoadTokenizer(folder);
    REQUIRE(t.ok());
    CHECK((*t)->eos_id() == -1);
    CHECK((*t)->stop_ids().empty());
    CHECK((*t)->special_tokens_source().find(folder + "/generation_config.json (absent)") != std::string::npos);
    CHECK((*t)->special_tokens_source().find(folder + "/tokenizer_config.json (absent)") != std::string::npos);
  }
  SECTION("specials change the hash") {
    auto a = LoadTokenizer(Folder(dir, "a", R"({"eos_token": "<|end|>"})", ""));
    auto b = LoadTokenizer(Folder(dir, "b", R"({"eos_token": "<|eot|>"})", ""));
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK((*a)->Hash() != (*b)->Hash());
  }
}

TEST_CASE("LoadTokenizer refuses special tokens it cannot resolve, naming the file and field") {
  testing::TempDir dir;
  auto unknown = LoadTokenizer(Folder(dir, "unknown", R"({"eos_token": "</s>"})", ""));
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Says(unknown.status(), "tokenizer_config.json: eos_token \"</s>\" is not a token"));
  auto shape = LoadTokenizer(Folder(dir, "shape", R"({"bos_token": 7})", ""));
  CHECK(Says(shape.status(), "tokenizer_config.json: bos_token must be a string"));
  auto range = LoadTokenizer(Folder(dir, "range", "", R"({"eos_token_id": [3, 6]})"));
  CHECK(range.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Says(range.status(), "generation_config.json: eos_token_id 6 is not a token id"));
  auto type = LoadTokenizer(Folder(dir, "type", "", R"({"eos_token_id": "3"})"));
  CHECK(Says(type.status(), "generation_config.json: eos_token_id \"3\""));
  auto corrupt = LoadTokenizer(Folder(dir, "corrupt", "{not json", ""));
  CHECK(Says(corrupt.status(), "tokenizer_config.json: not a JSON object"));
}

TEST_CASE("HfTokenizerFiles copies the source folder's files as they are") {
  testing::TempDir dir;
  const std::string config = R"({"eos_token": "<|end|>", "added_tokens_decoder": {}, "custom": 1})";
  const std::string folder = Folder(dir, "src", config, "");
  std::ofstream(folder + "/chat_template.jinja") << "{{ messages }}";
  auto t = LoadTokenizer(folder);
  REQUIRE(t.ok());
  CHECK((*t)->chat_template() == "{{ messages }}");
  std::map<std::string, std::string> files;
  for (auto& [name, text] : HfTokenizerFiles(**t, 64)) files[name] = text;
  CHECK(files["tokenizer_config.json"] == config);
  CHECK(files["chat_template.jinja"] == "{{ messages }}");
  CHECK(files.count("tokenizer.json") == 1);
}

}  // namespace specials

}  // namespace
}  // namespace rlmesh::actor
