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

}  // namespace
}  // namespace rlmesh
