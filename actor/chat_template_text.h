#pragma once

// Internal to :chat_template. Python's `str` operations on UTF-8 strings, as
// chat templates call them (`strip`, `split`, `upper`, slicing by code point).
// Every function expects valid UTF-8; the template source and every input
// string are validated once before rendering, so nothing here re-checks.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace rlmesh::actor::chat_template_internal {

bool IsValidUtf8(absl::string_view s);
std::u32string DecodeUtf8(absl::string_view s);
std::string EncodeUtf8(const std::u32string& s);
void AppendUtf8(char32_t c, std::string* out);
// Python's len(): code points, not bytes.
int64_t CodePointCount(absl::string_view s);

// str.isspace() for one code point (also what `\s` matches in Python's re).
bool IsPySpace(char32_t c);
// Index of the first byte at or after `pos` that does not start a whitespace
// code point.
size_t SkipPySpace(absl::string_view s, size_t pos);

// str.strip/lstrip/rstrip; `chars` absent strips whitespace.
std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);
// str.split / str.rsplit; `sep` absent splits on runs of whitespace. REQUIRES:
// `sep` is not empty (Python raises; callers check).
std::vector<std::string> PySplit(absl::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right);
// str.replace; count < 0 replaces all.
std::string PyReplace(absl::string_view s, absl::string_view old, absl::string_view repl,
                      int64_t count);
// str.find: code-point index of the first occurrence, or -1.
int64_t PyFind(absl::string_view s, absl::string_view sub);

// Case mapping covers ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic and
// fullwidth Latin (with ß -> SS and Greek final sigma); other scripts are
// left unchanged, where Python maps all of Unicode.
std::string PyUpper(absl::string_view s);
std::string PyLower(absl::string_view s);
// str.capitalize(): first character upper, the rest lower.
std::string PyCapitalize(absl::string_view s);
// str.title(): a cased letter after an uncased one goes upper, others lower.
std::string PyTitle(absl::string_view s);
// Jinja's `title` filter: words split at runs of whitespace and -({[<.
std::string JinjaTitle(absl::string_view s);

// Python's repr() of a str: quotes chosen as Python does, escapes for
// backslash, the quote, control and non-printable characters.
std::string PyReprString(absl::string_view s);

}  // namespace rlmesh::actor::chat_template_internal
