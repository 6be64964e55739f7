#include "common/sha256.h"

#include <string>

#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

// FIPS 180-2's examples.
constexpr char kTwoBlocks[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
constexpr char kTwoBlocksHex[] = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";

TEST_CASE("Sha256Hex matches known digests") {
  CHECK(Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(Sha256Hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(Sha256Hex(kTwoBlocks) == kTwoBlocksHex);
  CHECK(Sha256Hex(std::string(1'000'000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("Sha256 over pieces equals the digest of the whole") {
  const std::string whole = kTwoBlocks;
  for (size_t cut : {size_t{0}, size_t{1}, size_t{31}, size_t{55}, whole.size()}) {
    INFO("cut " << cut);
    Sha256 h;
    h.Update(whole.substr(0, cut));
    h.Update("");  // an empty piece adds nothing
    h.Update(whole.data() + cut, whole.size() - cut);
    CHECK(h.HexDigest() == kTwoBlocksHex);
  }
  // Binary bytes, NUL included.
  const std::string binary("a\0b", 3);
  Sha256 h;
  h.Update(binary.data(), 1);
  h.Update(binary.substr(1));
  CHECK(h.HexDigest() == Sha256Hex(binary));
  CHECK(Sha256Hex(binary) != Sha256Hex("a"));
}

}  // namespace
}  // namespace rlmesh
