#include "common/sha256.h"

#include <openssl/evp.h>

#include "common/log.h"

namespace rlmesh {

// EVP fails here only when it cannot allocate its context, which the rest
// of the process (strings, buffers) would not survive either.
Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  RLMESH_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1) << "sha256: EVP init failed";
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::Update(const void* data, size_t n) {
  RLMESH_CHECK(EVP_DigestUpdate(ctx_, data, n) == 1) << "sha256: EVP update failed";
}

std::string Sha256::HexDigest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  RLMESH_CHECK(EVP_DigestFinal_ex(ctx_, md, &n) == 1) << "sha256: EVP final failed";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

std::string Sha256Hex(absl::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.HexDigest();
}

}  // namespace rlmesh
