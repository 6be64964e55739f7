#include "tasks/encoding.h"

#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

TEST_CASE("prompts start with bos, responses end with eos, text round-trips") {
  actor::CharTokenizer tok;
  auto p = EncodePrompt(tok, "12+34=");
  REQUIRE(p.size() == 7);
  CHECK(p.front() == tok.bos_id());
  CHECK(tok.Decode({p.begin() + 1, p.end()}) == "12+34=");
  auto r = EncodeResponse(tok, "46");
  REQUIRE(r.size() == 3);
  CHECK(r.back() == tok.eos_id());
  CHECK(tok.Decode(r, /*skip_special=*/true) == "46");
}

// A chat template that writes the BOS itself (Llama 3's) gets no second one;
// "<bos>" typed as characters is text, not the token.
TEST_CASE("a prompt that encodes to the bos first gets no second bos") {
  struct BosFirst : actor::CharTokenizer {
    std::vector<int> Encode(const std::string& text) const override {
      if (text.rfind("[B]", 0) == 0) {
        std::vector<int> ids = {bos_id()};
        for (int id : CharTokenizer::Encode(text.substr(3))) ids.push_back(id);
        return ids;
      }
      return CharTokenizer::Encode(text);
    }
  };
  BosFirst tok;
  auto templated = EncodePrompt(tok, "[B]1+1=");
  REQUIRE(templated.size() == 5);
  CHECK(templated[0] == tok.bos_id());
  CHECK(templated[1] != tok.bos_id());
  actor::CharTokenizer chars;
  auto typed = EncodePrompt(chars, "<bos>1");
  REQUIRE(typed.size() == 7);
  CHECK(typed[0] == chars.bos_id());
  CHECK(typed[1] == chars.Encode("<")[0]);
}

}  // namespace
}  // namespace rlmesh
