#include "actor/chat_template_text.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actor/utf8.h"

namespace rlmesh::actor::chat_template_internal {
namespace {

// Length of the UTF-8 sequence that starts with byte `b` (1 for a stray
// continuation byte, which valid input never has).
int SeqLen(unsigned char b) {
  if (b < 0x80) return 1;
  if ((b >> 5) == 0x6) return 2;
  if ((b >> 4) == 0xE) return 3;
  if ((b >> 3) == 0x1E) return 4;
  return 1;
}

char32_t DecodeAt(absl::string_view s, size_t pos, int* len) {
  const auto b = static_cast<unsigned char>(s[pos]);
  *len = std::min<int>(SeqLen(b), static_cast<int>(s.size() - pos));
  if (*len == 1) return b;
  char32_t c = b & (0x7F >> *len);
  for (int i = 1; i < *len; ++i) c = (c << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  return c;
}

// Simple (one code point) case mappings for the scripts we cover.
char32_t UpperOne(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c == 0xB5) return 0x39C;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    if ((c <= 0x137 && c != 0x130) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c - 1 : c;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3CB) return c == 0x3C2 ? 0x3A3 : c - 32;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) return (c & 1) ? c - 1 : c;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

char32_t LowerOne(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F) {
    if ((c <= 0x137 && c != 0x130) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c : c + 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
    return c;
  }
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) return (c & 1) ? c : c + 1;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

bool IsCased(char32_t c) {
  return UpperOne(c) != c || LowerOne(c) != c || c == 0xDF || c == 0x138 || c == 0x149;
}

void AppendUpper(char32_t c, bool title, std::u32string* out) {
  if (c == 0xDF) {  // ß
    out->append(title ? U"Ss" : U"SS");
  } else if (c == 0x149) {  // ŉ
    out->append(U"\u02BCN");
  } else {
    out->push_back(UpperOne(c));
  }
}

// Lower-cases s[i]; a capital sigma after a cased letter and not before one
// is final (ς), as Python's str.lower() does.
void AppendLower(const std::u32string& s, size_t i, std::u32string* out) {
  const char32_t c = s[i];
  if (c == 0x130) {  // İ
    out->append(U"i\u0307");
  } else if (c == 0x3A3) {
    const bool after_cased = i > 0 && IsCased(s[i - 1]);
    const bool before_cased = i + 1 < s.size() && IsCased(s[i + 1]);
    out->push_back(after_cased && !before_cased ? 0x3C2 : 0x3C3);
  } else {
    out->push_back(LowerOne(c));
  }
}

std::u32string LowerAll(const std::u32string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size(); ++i) AppendLower(s, i, &out);
  return out;
}

bool IsPrintable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x8E2) {
    return false;
  }
  if (c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200F)) return false;
  if ((c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x2064)) return false;
  if ((c >= 0x2066 && c <= 0x206F) || c == 0x3000) return false;
  if ((c >= 0xD800 && c <= 0xF8FF) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB)) return false;
  if (c == 0xFFFE || c == 0xFFFF || c == 0x110BD || c == 0x110CD) return false;
  if ((c >= 0x13430 && c <= 0x1343F) || (c >= 0x1BCA0 && c <= 0x1BCA3)) return false;
  if ((c >= 0x1D173 && c <= 0x1D17A) || c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F)) {
    return false;
  }
  return c < 0xF0000;
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    int len = SeqLen(b);
    if (len == 1 || i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    int got = 0;
    const char32_t c = DecodeAt(s, i, &got);
    const char32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::u32string DecodeUtf8(absl::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int len = 0;
    out.push_back(DecodeAt(s, i, &len));
    i += len;
  }
  return out;
}

void AppendUtf8(char32_t c, std::string* out) { actor::AppendUtf8(static_cast<uint32_t>(c), out); }

std::string EncodeUtf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

int64_t CodePointCount(absl::string_view s) {
  int64_t n = 0;
  for (char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

size_t SkipPySpace(absl::string_view s, size_t pos) {
  while (pos < s.size()) {
    int len = 0;
    if (!IsPySpace(DecodeAt(s, pos, &len))) break;
    pos += len;
  }
  return pos;
}

std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  const std::u32string u = DecodeUtf8(s);
  const std::u32string set = chars ? DecodeUtf8(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : IsPySpace(c);
  };
  size_t b = 0, e = u.size();
  if (left) {
    while (b < e && strip_it(u[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(u[e - 1])) --e;
  }
  return EncodeUtf8(u.substr(b, e - b));
}

std::vector<std::string> PySplit(absl::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    if (!from_right) {
      size_t start = 0;
      while (maxsplit-- > 0) {
        const size_t hit = s.find(*sep, start);
        if (hit == absl::string_view::npos) break;
        parts.emplace_back(s.substr(start, hit - start));
        start = hit + sep->size();
      }
      parts.emplace_back(s.substr(start));
      return parts;
    }
    size_t end = s.size();
    while (maxsplit-- > 0 && end >= sep->size()) {
      const size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == absl::string_view::npos) break;
      parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    parts.emplace_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  // Whitespace runs: empty pieces never appear; once maxsplit is used up the
  // rest (trimmed on the side the split came from) is the last piece.
  std::u32string u = DecodeUtf8(s);
  if (from_right) std::reverse(u.begin(), u.end());
  size_t i = 0;
  std::vector<std::u32string> pieces;
  while (true) {
    while (i < u.size() && IsPySpace(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit == 0) {
      size_t e = u.size();
      while (e > i && IsPySpace(u[e - 1])) --e;
      pieces.push_back(u.substr(i, e - i));
      break;
    }
    size_t j = i;
    while (j < u.size() && !IsPySpace(u[j])) ++j;
    pieces.push_back(u.substr(i, j - i));
    --maxsplit;
    i = j;
  }
  if (from_right) {
    std::reverse(pieces.begin(), pieces.end());
    for (auto& p : pieces) std::reverse(p.begin(), p.end());
  }
  for (const auto& p : pieces) parts.push_back(EncodeUtf8(p));
  return parts;
}

std::string PyReplace(absl::string_view s, absl::string_view old, absl::string_view repl,
                      int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` before every code point and at the end.
    size_t i = 0;
    while (i <= s.size()) {
      if (count-- <= 0) {
        absl::StrAppend(&out, s.substr(i));
        break;
      }
      absl::StrAppend(&out, repl);
      if (i == s.size()) break;
      const int len = SeqLen(static_cast<unsigned char>(s[i]));
      absl::StrAppend(&out, s.substr(i, len));
      i += len;
    }
    return out;
  }
  size_t start = 0;
  while (count-- > 0) {
    const size_t hit = s.find(old, start);
    if (hit == absl::string_view::npos) break;
    absl::StrAppend(&out, s.substr(start, hit - start));
    absl::StrAppend(&out, repl);
    start = hit + old.size();
  }
  absl::StrAppend(&out, s.substr(start));
  return out;
}

int64_t PyFind(absl::string_view s, absl::string_view sub) {
  const size_t hit = s.find(sub);
  return hit == absl::string_view::npos ? -1 : CodePointCount(s.substr(0, hit));
}

std::string PyUpper(absl::string_view s) {
  std::u32string out;
  for (char32_t c : DecodeUtf8(s)) AppendUpper(c, /*title=*/false, &out);
  return EncodeUtf8(out);
}

std::string PyLower(absl::string_view s) { return EncodeUtf8(LowerAll(DecodeUtf8(s))); }

std::string PyCapitalize(absl::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  if (u.empty()) return "";
  std::u32string out;
  AppendUpper(u[0], /*title=*/true, &out);
  for (size_t i = 1; i < u.size(); ++i) AppendLower(u, i, &out);
  return EncodeUtf8(out);
}

std::string PyTitle(absl::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::u32string out;
  bool previous_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    if (previous_cased) {
      AppendLower(u, i, &out);
    } else {
      AppendUpper(u[i], /*title=*/true, &out);
    }
    previous_cased = IsCased(u[i]);
  }
  return EncodeUtf8(out);
}

std::string JinjaTitle(absl::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  auto is_break = [](char32_t c) {
    return IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::u32string out;
  size_t i = 0;
  while (i < u.size()) {
    // Items alternate: a run of break characters, then a word; each item is
    // upper-cased at its first character and lower-cased after it.
    const bool breaking = is_break(u[i]);
    size_t j = i;
    while (j < u.size() && is_break(u[j]) == breaking) ++j;
    std::u32string upper;
    AppendUpper(u[i], /*title=*/false, &upper);
    out += upper;
    out += LowerAll(u.substr(i + 1, j - i - 1));
    i = j;
  }
  return EncodeUtf8(out);
}

std::string PyReprString(absl::string_view s) {
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : DecodeUtf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else if (c <= 0xFF) {
      out += absl::StrFormat("\\x%02x", static_cast<uint32_t>(c));
    } else if (c <= 0xFFFF) {
      out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
    } else {
      out += absl::StrFormat("\\U%08x", static_cast<uint32_t>(c));
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace rlmesh::actor::chat_template_internal
