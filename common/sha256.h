#pragma once

// SHA-256, the one implementation rlmesh uses (OpenSSL's EVP): digests of
// checkpoint files and the identity hash of a tokenizer.

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace rlmesh {

// SHA-256 of bytes given in pieces (a multi-gigabyte file need not be held
// in memory):
//
//   Sha256 h;
//   h.Update(header);
//   h.Update(data, n);
//   std::string hex = h.HexDigest();
//
// Not thread-safe: one thread uses a hasher.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  // REQUIRES: HexDigest() was not called.
  void Update(const void* data, size_t n);
  void Update(absl::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // The digest of every byte given so far: 64 lower-case hex characters.
  // REQUIRES: called once; the hasher is finished after.
  std::string HexDigest();

 private:
  evp_md_ctx_st* const ctx_;
};

// SHA-256 of `bytes`, as 64 lower-case hex characters.
std::string Sha256Hex(absl::string_view bytes);

}  // namespace rlmesh
