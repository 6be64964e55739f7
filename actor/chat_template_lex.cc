// The lexer follows Jinja's rules for where template text ends and how much
// whitespace the tags take with them, since the rendered prompt must match
// Jinja's byte for byte:
//  - `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`,
//    `-#}` strip all whitespace after it.
//  - trim_blocks: a block or comment tag eats the one newline right after it.
//  - lstrip_blocks: spaces and tabs between the start of a line and a block
//    or comment tag are dropped (not before `{{`, and not with `{%+`).

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actor/chat_template_ast.h"
#include "actor/chat_template_text.h"

namespace rlmesh::actor::chat_template_internal {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Jinja names may be any Python identifier. Without Unicode tables we take a
// non-ASCII code point as a letter unless it is whitespace or in a block of
// punctuation and symbols.
bool IsNonAsciiNameChar(char32_t c) {
  if (IsPySpace(c) || (c >= 0xA1 && c <= 0xBF && c != 0xAA && c != 0xB5 && c != 0xBA)) return false;
  if (c == 0xD7 || c == 0xF7 || (c >= 0x2000 && c <= 0x2BFF) || (c >= 0x3000 && c <= 0x303F)) {
    return false;
  }
  if ((c >= 0xFE30 && c <= 0xFE4F) || (c >= 0xFF00 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20)) {
    return false;
  }
  return !(c >= 0x1F000 && c <= 0x1FAFF) && !(c >= 0xE000 && c <= 0xF8FF);
}

// The code point at `p` and its length in bytes.
char32_t CodePointAt(absl::string_view s, size_t p, size_t* len) {
  *len = 1;
  while (p + *len < s.size() && (static_cast<unsigned char>(s[p + *len]) & 0xC0) == 0x80) ++*len;
  return DecodeUtf8(s.substr(p, *len))[0];
}

// The end of the name starting at `p`, or `p` if none starts there.
size_t NameEnd(absl::string_view s, size_t p) {
  size_t e = p;
  while (e < s.size()) {
    const char c = s[e];
    if (static_cast<unsigned char>(c) < 0x80) {
      if (!(e == p ? IsNameStart(c) : IsNameChar(c))) break;
      ++e;
    } else {
      size_t len = 0;
      if (!IsNonAsciiNameChar(CodePointAt(s, e, &len))) break;
      e += len;
    }
  }
  return e;
}

// Python's "unicode-escape" decoding of a string literal's body, which is
// what Jinja applies to it.
absl::StatusOr<std::string> DecodeEscapes(absl::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 >= body.size()) {
      out.push_back(body[i]);
      continue;
    }
    const char c = body[++i];
    auto hex = [&](int digits) -> absl::StatusOr<char32_t> {
      char32_t v = 0;
      for (int k = 1; k <= digits; ++k) {
        if (i + k >= body.size() || !IsHex(body[i + k])) {
          return absl::InvalidArgumentError(
              absl::StrCat("truncated \\", std::string(1, c), " escape in string literal"));
        }
        const char h = body[i + k];
        v = v * 16 + static_cast<char32_t>(IsDigit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      i += digits;
      if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        return absl::InvalidArgumentError("string literal escape is not a Unicode scalar value");
      }
      return v;
    };
    switch (c) {
      case '\n': break;  // line continuation
      case '\\': case '\'': case '"': out.push_back(c); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': case 'u': case 'U': {
        RLMESH_ASSIGN_OR_RETURN(char32_t v, hex(c == 'x' ? 2 : c == 'u' ? 4 : 8));
        AppendUtf8(v, &out);
        break;
      }
      case 'N':
        return absl::UnimplementedError("unsupported: \\N{...} escapes in string literals");
      default:
        if (c >= '0' && c <= '7') {
          char32_t v = c - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            v = v * 8 + (body[++i] - '0');
          }
          AppendUtf8(v, &out);
        } else if (static_cast<unsigned char>(c) >= 0x80) {
          // Jinja escapes non-ASCII text as \xNN/\uNNNN before decoding, so a
          // backslash in front of such a character stays, followed by that
          // escape spelled out.
          size_t len = 1;
          while (i + len < body.size() && (static_cast<unsigned char>(body[i + len]) & 0xC0) == 0x80) ++len;
          const char32_t cp = DecodeUtf8(body.substr(i, len))[0];
          out += cp <= 0xFF ? absl::StrFormat("\\x%02x", static_cast<uint32_t>(cp))
                 : cp <= 0xFFFF ? absl::StrFormat("\\u%04x", static_cast<uint32_t>(cp))
                                : absl::StrFormat("\\U%08x", static_cast<uint32_t>(cp));
          i += len - 1;
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(absl::string_view source) {
    // Jinja reads \r\n and \r as \n and drops one trailing newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      const size_t tag = FindTagStart(pos_);
      if (tag == std::string::npos) {
        Emit(TokenType::kData, src_.substr(pos_), pos_);
        break;
      }
      const char kind = src_[tag + 1];
      size_t after = tag + 2;
      const char sign = after < n && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
      if (sign != 0) ++after;
      size_t raw_body = 0;
      const bool raw = kind == '%' && MatchRawBegin(after, &raw_body);
      Emit(TokenType::kData, StripBefore(src_.substr(pos_, tag - pos_), sign, kind != '{'), pos_);
      if (raw) {
        RLMESH_RETURN_IF_ERROR(LexRaw(tag, raw_body));
      } else if (kind == '#') {
        RLMESH_RETURN_IF_ERROR(LexComment(tag, after));
      } else {
        Emit(kind == '%' ? TokenType::kBlockBegin : TokenType::kVariableBegin, "", tag);
        RLMESH_RETURN_IF_ERROR(LexTag(kind == '%', tag, after));
      }
    }
    Token eof;
    eof.type = TokenType::kEof;
    eof.line = LineAt(n);
    out_.push_back(std::move(eof));
    return std::move(out_);
  }

 private:
  int LineAt(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) -
                                newlines_.begin());
  }

  absl::Status Error(size_t pos, absl::string_view message) const {
    return ErrorAt(absl::StatusCode::kInvalidArgument, LineAt(pos), message);
  }

  void Emit(TokenType type, std::string text, size_t pos) {
    if (type == TokenType::kData && text.empty()) return;
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = LineAt(pos);
    out_.push_back(std::move(t));
  }

  size_t FindTagStart(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // The text before a tag: all trailing whitespace goes with `-`; with
  // lstrip_blocks, a whitespace-only start of line goes before a block or
  // comment tag.
  std::string StripBefore(std::string text, char sign, bool lstrip_allowed) const {
    if (sign == '-') return PyStrip(text, std::nullopt, /*left=*/false, /*right=*/true);
    if (sign == '+' || !lstrip_allowed) return text;
    const size_t nl = text.rfind('\n');
    const size_t line_start = nl == std::string::npos ? 0 : nl + 1;
    if (line_start == 0 && !line_starting_) return text;
    if (line_start < text.size() && SkipPySpace(text, line_start) == text.size()) {
      text.resize(line_start);
    }
    return text;
  }

  bool StartsWith(size_t p, absl::string_view s) const {
    return absl::string_view(src_).substr(p, s.size()) == s;
  }

  // `{%[-+]? raw [-]%}` starting at `p` (after the sign); sets `body` to where
  // the verbatim text starts.
  bool MatchRawBegin(size_t p, size_t* body) const {
    p = SkipPySpace(src_, p);
    if (!StartsWith(p, "raw")) return false;
    p = SkipPySpace(src_, p + 3);
    if (StartsWith(p, "-%}")) {
      *body = SkipPySpace(src_, p + 3);
      return true;
    }
    if (StartsWith(p, "%}")) {
      *body = p + 2;
      return true;
    }
    return false;
  }

  // Where text resumes after a "%}" (with its `+`/`-` marker) at `p`:
  // `-` eats the whitespace after it, a plain one the newline (trim_blocks),
  // `+` nothing. 0 when no block-tag end is at `p`.
  size_t BlockTagEnd(size_t p) const {
    if (StartsWith(p, "+%}")) return p + 3;
    if (StartsWith(p, "-%}")) return SkipPySpace(src_, p + 3);
    if (StartsWith(p, "%}")) return p + 2 + (StartsWith(p + 2, "\n") ? 1 : 0);
    return 0;
  }

  absl::Status LexRaw(size_t tag, size_t body) {
    line_starting_ = body > 0 && src_[body - 1] == '\n';
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (sign != 0) ++p;
      p = SkipPySpace(src_, p);
      if (!StartsWith(p, "endraw")) continue;
      p = SkipPySpace(src_, p + 6);
      const size_t end = BlockTagEnd(p);
      if (end == 0) continue;
      Emit(TokenType::kData, StripBefore(src_.substr(body, i - body), sign, true), body);
      pos_ = end;
      line_starting_ = src_[end - 1] == '\n';
      return absl::OkStatus();
    }
    return Error(tag, "missing {% endraw %} for this {% raw %}");
  }

  absl::Status LexComment(size_t tag, size_t body) {
    const size_t close = src_.find("#}", body);
    if (close == std::string::npos) return Error(tag, "missing end of comment tag '#}'");
    const char sign = close > body && (src_[close - 1] == '-' || src_[close - 1] == '+')
                          ? src_[close - 1] : 0;
    size_t end = close + 2;
    if (sign == '-') {
      end = SkipPySpace(src_, end);
    } else if (sign == 0 && StartsWith(end, "\n")) {
      ++end;
    }
    pos_ = end;
    line_starting_ = src_[end - 1] == '\n';
    return absl::OkStatus();
  }

  // Inside {{ }} or {% %}: names, literals and operators up to the closing
  // delimiter, which only counts while brackets are balanced.
  absl::Status LexTag(bool block, size_t tag, size_t p) {
    const size_t n = src_.size();
    std::vector<char> closers;
    while (true) {
      if (p >= n) {
        return Error(tag, block ? "unclosed '{%' tag: expected '%}'" : "unclosed '{{' tag: expected '}}'");
      }
      if (closers.empty()) {
        size_t end = 0;
        if (block) {
          end = BlockTagEnd(p);
        } else if (StartsWith(p, "-}}")) {
          end = SkipPySpace(src_, p + 3);
        } else if (StartsWith(p, "}}")) {
          end = p + 2;
        }
        if (end != 0) {
          Emit(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", p);
          pos_ = end;
          line_starting_ = src_[end - 1] == '\n';
          return absl::OkStatus();
        }
      }
      const char c = src_[p];
      const size_t skipped = SkipPySpace(src_, p);
      if (skipped != p) {
        p = skipped;
      } else if (IsDigit(c)) {
        RLMESH_ASSIGN_OR_RETURN(p, LexNumber(p));
      } else if (const size_t e = NameEnd(src_, p); e != p) {
        Emit(TokenType::kName, src_.substr(p, e - p), p);
        p = e;
      } else if (c == '\'' || c == '"') {
        size_t e = p + 1;
        while (e < n && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
        if (e >= n) return Error(p, "unterminated string literal");
        auto decoded = DecodeEscapes(absl::string_view(src_).substr(p + 1, e - p - 1));
        if (!decoded.ok()) return ErrorAt(decoded.status().code(), LineAt(p), decoded.status().message());
        Emit(TokenType::kString, *std::move(decoded), p);
        p = e + 1;
      } else {
        RLMESH_ASSIGN_OR_RETURN(p, LexOperator(p, &closers));
      }
    }
  }

  // (\d+_)*\d+ at `p`; returns the end, or npos without a digit at `p`.
  size_t ScanDigits(size_t p, bool (*digit)(char)) const {
    if (p >= src_.size() || !digit(src_[p])) return std::string::npos;
    while (true) {
      while (p < src_.size() && digit(src_[p])) ++p;
      if (p + 1 < src_.size() && src_[p] == '_' && digit(src_[p + 1])) {
        ++p;
        continue;
      }
      return p;
    }
  }

  absl::StatusOr<size_t> LexNumber(size_t p) {
    const size_t npos = std::string::npos;
    auto clean = [&](size_t b, size_t e) {
      std::string s = src_.substr(b, e - b);
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      return s;
    };
    // A float: digits, then .digits and/or an exponent; never right after a
    // dot (so `x.0.1` is two item lookups, as in Jinja).
    if (p == 0 || src_[p - 1] != '.') {
      const size_t whole = ScanDigits(p, IsDigit);
      const size_t frac = whole < src_.size() && src_[whole] == '.' ? ScanDigits(whole + 1, IsDigit) : npos;
      const size_t mant = frac != npos ? frac : whole;
      size_t end = npos;
      if (mant < src_.size() && (src_[mant] == 'e' || src_[mant] == 'E')) {
        size_t q = mant + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        end = ScanDigits(q, IsDigit);
      }
      if (end == npos) end = frac;
      if (end != npos) {
        Token t;
        t.type = TokenType::kFloat;
        t.float_value = std::strtod(clean(p, end).c_str(), nullptr);
        t.line = LineAt(p);
        out_.push_back(std::move(t));
        return end;
      }
    }
    int base = 10;
    size_t digits = p;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      const char x = src_[p + 1];
      base = (x == 'x' || x == 'X') ? 16 : (x == 'o' || x == 'O') ? 8 : (x == 'b' || x == 'B') ? 2 : 10;
      if (base != 10) digits = p + 2;
    }
    size_t end = digits;
    while (end < src_.size() &&
           (src_[end] == '_' || (base == 16 ? IsHex(src_[end]) : IsDigit(src_[end])))) {
      ++end;
    }
    std::string text = clean(digits, end);
    if (text.empty() || (base == 10 && text.size() > 1 && text[0] == '0' &&
                         text.find_first_not_of('0') != std::string::npos)) {
      return Error(p, "invalid integer literal");
    }
    errno = 0;
    char* stop = nullptr;
    const long long v = std::strtoll(text.c_str(), &stop, base);
    if (errno == ERANGE || *stop != '\0') return Error(p, "invalid or too large integer literal");
    Token t;
    t.type = TokenType::kInteger;
    t.int_value = v;
    t.line = LineAt(p);
    out_.push_back(std::move(t));
    return end;
  }

  absl::StatusOr<size_t> LexOperator(size_t p, std::vector<char>* closers) {
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (StartsWith(p, op)) {
        Emit(TokenType::kOperator, op, p);
        return p + 2;
      }
    }
    const char c = src_[p];
    if (std::string("+-/*%~[](){}><=.:|,;").find(c) == std::string::npos) {
      size_t len = 0;
      CodePointAt(src_, p, &len);
      return Error(p, absl::StrCat("unexpected character '", src_.substr(p, len), "' in tag"));
    }
    if (c == '(' || c == '[' || c == '{') closers->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    if (c == ')' || c == ']' || c == '}') {
      if (closers->empty()) return Error(p, absl::StrCat("unexpected '", std::string(1, c), "'"));
      if (closers->back() != c) {
        return Error(p, absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                                     std::string(1, closers->back()), "'"));
      }
      closers->pop_back();
    }
    Emit(TokenType::kOperator, std::string(1, c), p);
    return p + 1;
  }

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> out_;
  size_t pos_ = 0;
  // Whether the text after the last tag starts a line (Jinja's lstrip_blocks
  // needs this when that text has no newline of its own).
  bool line_starting_ = true;
};

}  // namespace

absl::Status ErrorAt(absl::StatusCode code, int line, absl::string_view message) {
  return absl::Status(code, absl::StrCat("chat template line ", line, ": ", message));
}

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  return Lexer(source).Run();
}

}  // namespace rlmesh::actor::chat_template_internal
