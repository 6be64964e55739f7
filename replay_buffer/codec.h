#pragma once

// Byte-level encodings of the replay store: big-endian integers for keys that
// range-scan in numeric order, a bounds-checked reader for values, and the
// checksummed opaque tokens (query page tokens, FIFO ack tokens).

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

namespace rlmesh::replay {

inline void PutBe64(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void PutBe32(std::string* out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void PutDouble(std::string* out, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  PutBe64(out, bits);
}
inline void PutBytes(std::string* out, absl::string_view s) {
  PutBe32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

// Reads what the Put* functions wrote; every read fails (returns false) past
// the end instead of reading out of bounds.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool Be64(uint64_t* v) {
    if (in_.size() < 8) return false;
    uint64_t r = 0;
    for (int i = 0; i < 8; ++i) r = (r << 8) | static_cast<uint8_t>(in_[i]);
    in_.remove_prefix(8);
    *v = r;
    return true;
  }
  bool Be32(uint32_t* v) {
    if (in_.size() < 4) return false;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r = (r << 8) | static_cast<uint8_t>(in_[i]);
    in_.remove_prefix(4);
    *v = r;
    return true;
  }
  bool I64(int64_t* v) {
    uint64_t u;
    if (!Be64(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool Double(double* d) {
    uint64_t bits;
    if (!Be64(&bits)) return false;
    std::memcpy(d, &bits, sizeof bits);
    return true;
  }
  bool Bytes(std::string* s) {
    uint32_t n;
    if (!Be32(&n) || in_.size() < n) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }
  size_t remaining() const { return in_.size(); }

 private:
  absl::string_view in_;
};

// FNV-1a 64, seeded. Detects accidental or casual tampering of tokens; it is
// not a cryptographic MAC (the RPCs are already guarded by the shared token).
inline uint64_t Fingerprint(absl::string_view s, uint64_t seed = 0x9e3779b97f4a7c15ull) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace rlmesh::replay
