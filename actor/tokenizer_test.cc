#include "actor/tokenizer.h"

#include <cstdlib>
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

TEST_CASE("Sha256Hex matches a known digest") {
  CHECK(Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("Chat templates") {
  std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "2+2?"}};
  CHECK(ApplyChatTemplate(m, ChatFormat::kChatMl) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  CHECK(ApplyChatTemplate(m, ChatFormat::kPlain, false) == "system: Be brief.\nuser: 2+2?\n");
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
    CHECK((*tok)->eos_id() == (*tok)->TokenId("<|im_end|>"));
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

}  // namespace
}  // namespace rlmesh::actor
