// Over 600 lines: the char tokenizer, byte-level BPE (pre-tokenizer regex,
// merges, added tokens) and tokenizer.json loading share their byte and
// Unicode tables; they are one reader of one file format.
#include "actor/tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "actor/chat_template.h"
#include "actor/utf8.h"
#include "common/json_file.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace rlmesh::actor {

using nlohmann::json;

// ---------------------------------------------------------------- CharTokenizer

namespace {
constexpr char kCharAlphabet[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ \n+-*/=()<>.,:;?!'\"_%#@&^|~[]{}$`\\";
}  // namespace

CharTokenizer::CharTokenizer() {
  tokens_ = {"<pad>", "<bos>", "<eos>", "<unk>"};
  for (int& id : char_to_id_) id = 3;
  for (const char* p = kCharAlphabet; *p != '\0'; ++p) {
    char_to_id_[static_cast<unsigned char>(*p)] = static_cast<int>(tokens_.size());
    tokens_.push_back(std::string(1, *p));
  }
}

std::vector<int> CharTokenizer::Encode(const std::string& text) const {
  std::vector<int> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    ids.push_back(char_to_id_[c]);
    if (c >= 0x80) {  // one <unk> per UTF-8 character, not per byte
      while (i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) ++i;
    }
  }
  return ids;
}

std::string CharTokenizer::Decode(const std::vector<int>& ids, bool skip_special) const {
  std::string out;
  for (int id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (id < 4 && skip_special) continue;
    out += tokens_[id];
  }
  return out;
}

int CharTokenizer::TokenId(const std::string& token) const {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i] == token) return static_cast<int>(i);
  }
  return -1;
}

std::string CharTokenizer::HfTokenizerJson() const {
  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    vocab[tokens_[i]] = i;
    if (i < 4) {
      added.push_back({{"id", i}, {"content", tokens_[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
    }
  }
  json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", nullptr},
            {"post_processor", nullptr},
            {"decoder", {{"type", "Fuse"}}},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", "<unk>"},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"ignore_merges", false},
              {"vocab", vocab},
              {"merges", json::array()}}}};
  return j.dump(2) + "\n";
}

std::string CharTokenizer::Hash() const {
  std::string def = "rlmesh-char-v1\n";
  for (const auto& t : tokens_) def += t + '\x1f';
  return Sha256Hex(def);
}

// ----------------------------------------------------------------- BpeTokenizer

namespace {

const char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";


// Length of the UTF-8 sequence that starts with byte c (1 for stray bytes).
size_t Utf8Len(unsigned char c) {
  if (c < 0xC0) return 1;
  if (c < 0xE0) return 2;
  if (c < 0xF0) return 3;
  return 4;
}

// Oniguruma (what `tokenizers` uses) reads \s as Unicode White_Space; ICU's
// \s is narrower (no U+000B, U+0085). Rewrite \s and \S outside of escapes.
std::string OnigToIcu(const std::string& p) {
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      if (n == 's') {
        out += "\\p{White_Space}";
      } else if (n == 'S') {
        out += "\\P{White_Space}";
      } else {
        out += p.substr(i, 2);
      }
      ++i;
    } else {
      out.push_back(p[i]);
    }
  }
  return out;
}

struct SplitStep {
  enum Kind { kByteLevel, kSplit } kind;
  bool add_prefix_space = false;
  std::unique_ptr<icu::RegexPattern> regex;  // null for ByteLevel without regex
  std::string behavior = "Isolated";
  bool invert = false;
};

}  // namespace

struct BpeTokenizer::Impl {
  std::unordered_map<std::string, int> vocab;
  std::vector<std::string> id_to_token;
  std::vector<bool> is_special;
  std::vector<bool> is_added;
  std::unordered_map<std::string, int> merge_rank;  // "a b" -> rank
  bool ignore_merges = false;
  bool nfc = false;
  std::vector<SplitStep> steps;
  std::vector<std::pair<std::string, int>> added;  // content, id (longest first)
  bool added_first_byte[256] = {};                  // some added token starts with it
  std::string byte_to_char[256];
  std::unordered_map<uint32_t, uint8_t> char_to_byte;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int>> cache;

  void InitByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      AppendUtf8(cp, &byte_to_char[b]);
      char_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }

  // Splits each piece by a regex with the given behaviour.
  std::vector<std::string> ApplyRegex(const std::vector<std::string>& pieces, const icu::RegexPattern& re,
                                      const std::string& behavior, bool invert) const {
    std::vector<std::string> out;
    UErrorCode err = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexMatcher> m(re.matcher(err));
    for (const auto& piece : pieces) {
      icu::UnicodeString u = icu::UnicodeString::fromUTF8(piece);
      m->reset(u);
      // (start, end, is_match) spans covering the piece.
      std::vector<std::tuple<int32_t, int32_t, bool>> spans;
      int32_t prev = 0;
      while (m->find()) {
        UErrorCode e2 = U_ZERO_ERROR;
        int32_t s = m->start(e2), e = m->end(e2);
        if (e == s) continue;
        if (s > prev) spans.emplace_back(prev, s, false);
        spans.emplace_back(s, e, true);
        prev = e;
      }
      if (prev < u.length()) spans.emplace_back(prev, u.length(), false);
      auto text = [&](int32_t s, int32_t e) {
        std::string r;
        u.tempSubStringBetween(s, e).toUTF8String(r);
        return r;
      };
      for (auto& [s, e, is_match] : spans) {
        bool delim = invert ? !is_match : is_match;
        if (behavior == "Removed" && delim) continue;
        out.push_back(text(s, e));
      }
      (void)behavior;
    }
    return out;
  }

  std::vector<std::string> PreTokenize(const std::string& text) const {
    std::vector<std::string> pieces = {text};
    for (const auto& step : steps) {
      if (step.kind == SplitStep::kByteLevel && step.add_prefix_space) {
        for (auto& p : pieces) {
          if (!p.empty() && p[0] != ' ') p = " " + p;
        }
      }
      if (step.regex) pieces = ApplyRegex(pieces, *step.regex, step.behavior, step.invert);
    }
    return pieces;
  }

  // BPE over one pre-token (raw UTF-8), appending ids.
  void EncodeWord(const std::string& word, std::vector<int>* ids) const {
    std::string mapped;
    for (unsigned char c : word) mapped += byte_to_char[c];
    {
      std::lock_guard<std::mutex> l(cache_mu);
      auto it = cache.find(mapped);
      if (it != cache.end()) {
        ids->insert(ids->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int> out;
    auto direct = vocab.find(mapped);
    if (ignore_merges && direct != vocab.end()) {
      out.push_back(direct->second);
    } else {
      std::vector<std::string> sym;
      for (size_t i = 0; i < mapped.size();) {
        size_t n = Utf8Len(static_cast<unsigned char>(mapped[i]));
        sym.push_back(mapped.substr(i, n));
        i += n;
      }
      while (sym.size() > 1) {
        int best = INT_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
          auto it = merge_rank.find(sym[i] + " " + sym[i + 1]);
          if (it != merge_rank.end() && it->second < best) {
            best = it->second;
            at = i;
          }
        }
        if (best == INT_MAX) break;
        // Merge every occurrence of the best pair, left to right.
        const std::string a = sym[at], b = sym[at + 1];
        std::vector<std::string> next;
        for (size_t i = 0; i < sym.size();) {
          if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
            next.push_back(a + b);
            i += 2;
          } else {
            next.push_back(sym[i]);
            ++i;
          }
        }
        sym.swap(next);
      }
      for (const auto& s : sym) {
        auto it = vocab.find(s);
        if (it != vocab.end()) out.push_back(it->second);
        // A symbol outside the vocabulary (no unk token in byte-level BPE) is
        // dropped, as `tokenizers` does.
      }
    }
    ids->insert(ids->end(), out.begin(), out.end());
    std::lock_guard<std::mutex> l(cache_mu);
    if (cache.size() < 100000) cache.emplace(std::move(mapped), std::move(out));
  }

  std::string Normalize(const std::string& s) const {
    if (!nfc) return s;
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
    icu::UnicodeString u = n->normalize(icu::UnicodeString::fromUTF8(s), err);
    std::string out;
    u.toUTF8String(out);
    return U_SUCCESS(err) ? out : s;
  }

  void EncodeText(const std::string& text, std::vector<int>* ids) const {
    if (text.empty()) return;
    for (const auto& piece : PreTokenize(Normalize(text))) EncodeWord(piece, ids);
  }
};

BpeTokenizer::BpeTokenizer() : impl_(std::make_unique<Impl>()) {}
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto t = FromJson(ss.str());
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  return t;
}


absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(const std::string& text) {
  // A field of the wrong JSON type throws inside nlohmann; report it instead.
  try {
    return FromJsonInternal(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
}

// Long because: reads tokenizer.json's sections in file order (model, merges, added tokens,
// normalizer, pre-tokenizers, decoder) into one Impl, validating each where it is read.
absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJsonInternal(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt JSON at byte ", e.byte));
  }
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  Impl& im = *t->impl_;
  im.InitByteMap();
  t->hash_ = Sha256Hex(text);
  t->json_ = text;
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: no \"model\" object");
  }
  const json& model = j["model"];
  if (model.value("type", std::string("BPE")) != "BPE") {
    return absl::InvalidArgumentError("model.type: only \"BPE\" is supported");
  }
  if (model.value("byte_fallback", false)) return absl::InvalidArgumentError("model.byte_fallback: not supported");
  if (model.contains("continuing_subword_prefix") && !model["continuing_subword_prefix"].is_null() &&
      !model["continuing_subword_prefix"].get<std::string>().empty()) {
    return absl::InvalidArgumentError("model.continuing_subword_prefix: not supported");
  }
  im.ignore_merges = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError("model.vocab: missing or not an object");
  }
  int max_id = -1;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it->is_number_integer() || it->get<int>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("model.vocab[\"", it.key(), "\"]: id must be a non-negative integer"));
    }
    im.vocab[it.key()] = it->get<int>();
    max_id = std::max(max_id, it->get<int>());
  }
  if (model.contains("merges") && model["merges"].is_array()) {
    int rank = 0;
    for (const auto& m : model["merges"]) {
      std::string key;
      if (m.is_string()) {
        key = m.get<std::string>();
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        key = m[0].get<std::string>() + " " + m[1].get<std::string>();
      } else {
        return absl::InvalidArgumentError(absl::StrCat("model.merges[", rank, "]: expected \"a b\" or [a, b]"));
      }
      im.merge_rank.emplace(key, rank++);
    }
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a.contains("content")) {
        return absl::InvalidArgumentError("added_tokens: each needs id and content");
      }
      int id = a["id"].get<int>();
      std::string content = a["content"].get<std::string>();
      im.vocab[content] = id;
      max_id = std::max(max_id, id);
      im.added.emplace_back(content, id);
    }
  }
  t->vocab_size_ = max_id + 1;
  im.id_to_token.assign(t->vocab_size_, "");
  im.is_special.assign(t->vocab_size_, false);
  im.is_added.assign(t->vocab_size_, false);
  for (const auto& [tok, id] : im.vocab) im.id_to_token[id] = tok;
  for (const auto& a : j.value("added_tokens", json::array())) {
    int id = a["id"].get<int>();
    im.is_added[id] = true;
    im.is_special[id] = a.value("special", false);
  }
  std::sort(im.added.begin(), im.added.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& a : im.added) {
    if (!a.first.empty()) im.added_first_byte[static_cast<unsigned char>(a.first[0])] = true;
  }

  // Normalizer.
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    std::vector<json> list;
    if (n.value("type", "") == "Sequence") {
      for (const auto& x : n.value("normalizers", json::array())) list.push_back(x);
    } else {
      list.push_back(n);
    }
    for (const auto& x : list) {
      std::string type = x.value("type", "");
      if (type == "NFC") {
        im.nfc = true;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("normalizer.type \"", type, "\" is not supported"));
      }
    }
  }
  // Pre-tokenizers.
  std::vector<json> pre;
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    const json& p = j["pre_tokenizer"];
    if (p.value("type", "") == "Sequence") {
      for (const auto& x : p.value("pretokenizers", json::array())) pre.push_back(x);
    } else {
      pre.push_back(p);
    }
  }
  for (const auto& p : pre) {
    std::string type = p.value("type", "");
    SplitStep step;
    std::string pattern;
    if (type == "ByteLevel") {
      step.kind = SplitStep::kByteLevel;
      step.add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) pattern = kGpt2Pattern;
    } else if (type == "Split") {
      step.kind = SplitStep::kSplit;
      step.behavior = p.value("behavior", std::string("Isolated"));
      step.invert = p.value("invert", false);
      if (step.behavior != "Isolated" && step.behavior != "Removed") {
        return absl::InvalidArgumentError(absl::StrCat("pre_tokenizer Split.behavior \"", step.behavior, "\" is not supported"));
      }
      const json& pat = p.value("pattern", json::object());
      if (pat.contains("Regex")) {
        pattern = pat["Regex"].get<std::string>();
      } else if (pat.contains("String")) {
        // A literal: escape it for the regex engine.
        pattern = "\\Q" + pat["String"].get<std::string>() + "\\E";
      } else {
        return absl::InvalidArgumentError("pre_tokenizer Split.pattern: needs Regex or String");
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("pre_tokenizer.type \"", type, "\" is not supported"));
    }
    if (!pattern.empty()) {
      UErrorCode err = U_ZERO_ERROR;
      UParseError perr;
      std::string icu_pattern = OnigToIcu(pattern);
      step.regex.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pattern), perr, err));
      if (U_FAILURE(err)) {
        return absl::InvalidArgumentError(absl::StrCat("pre_tokenizer regex does not compile: ", pattern));
      }
    }
    im.steps.push_back(std::move(step));
  }
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    std::string type = j["decoder"].value("type", "");
    if (type != "ByteLevel") {
      return absl::InvalidArgumentError(absl::StrCat("decoder.type \"", type, "\" is not supported"));
    }
  }
  return t;
}

int BpeTokenizer::TokenId(const std::string& token) const {
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

std::vector<int> BpeTokenizer::Encode(const std::string& text) const {
  std::vector<int> ids;
  const Impl& im = *impl_;
  // Added tokens split the text first: at each position the longest one
  // matches; the text between is encoded normally.
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const std::pair<std::string, int>* hit = nullptr;
    if (im.added_first_byte[static_cast<unsigned char>(text[i])]) {
      for (const auto& a : im.added) {
        if (!a.first.empty() && text.compare(i, a.first.size(), a.first) == 0) {
          hit = &a;
          break;  // sorted longest first
        }
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    im.EncodeText(text.substr(start, i - start), &ids);
    ids.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  im.EncodeText(text.substr(start), &ids);
  return ids;
}

namespace {

// Bytes -> valid UTF-8 as Rust's String::from_utf8_lossy (what tokenizers'
// ByteLevel decoder returns): each maximal invalid subsequence becomes one
// U+FFFD. Random ids can end mid-character; text fields must stay UTF-8.
std::string Utf8Lossy(const std::string& in) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(in.size());
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = static_cast<unsigned char>(in[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // range of the first continuation byte
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      out += kReplacement;  // a byte that never starts a character
      ++i;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < n) {
      const unsigned char c = static_cast<unsigned char>(in[j]);
      const bool ok = got == 0 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++got;
      ++j;
    }
    if (got == need) {
      out.append(in, i, j - i);
    } else {
      out += kReplacement;  // the maximal valid prefix of a character, cut short
    }
    i = j;
  }
  return out;
}

}  // namespace

std::string BpeTokenizer::Decode(const std::vector<int>& ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string out;
  for (int id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    if (im.is_added[id]) {
      if (skip_special && im.is_special[id]) continue;
      out += im.id_to_token[id];
      continue;
    }
    const std::string& tok = im.id_to_token[id];
    for (size_t i = 0; i < tok.size();) {
      size_t n = Utf8Len(static_cast<unsigned char>(tok[i]));
      // Decode the code point to look up its byte.
      uint32_t cp = static_cast<unsigned char>(tok[i]);
      if (n == 2) cp = ((cp & 0x1F) << 6) | (tok[i + 1] & 0x3F);
      if (n == 3) cp = ((cp & 0x0F) << 12) | ((tok[i + 1] & 0x3F) << 6) | (tok[i + 2] & 0x3F);
      if (n == 4) cp = ((cp & 0x07) << 18) | ((tok[i + 1] & 0x3F) << 12) | ((tok[i + 2] & 0x3F) << 6) | (tok[i + 3] & 0x3F);
      auto it = im.char_to_byte.find(cp);
      if (it != im.char_to_byte.end()) {
        out.push_back(static_cast<char>(it->second));
      } else {
        out += tok.substr(i, n);
      }
      i += n;
    }
  }
  return Utf8Lossy(out);
}

namespace {

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The special tokens and stop ids of the folder `dir` (tokenizer_config.json
// and generation_config.json, both optional) for a tokenizer of `vocab`
// ids, as transformers reads them.
struct Specials {
  int bos = -1, eos = -1, pad = -1;
  std::vector<int> stop;
  std::string source;
};

absl::StatusOr<Specials> ReadSpecials(const std::string& dir, const BpeTokenizer& t) {
  Specials out;
  std::vector<std::string> read;
  const std::string tc_path = dir + "/tokenizer_config.json";
  absl::StatusOr<json> tc_file = ReadJsonObjectFile(tc_path);
  if (!tc_file.ok() && !absl::IsNotFound(tc_file.status())) return tc_file.status();
  if (tc_file.ok()) {
    const json& tc = *tc_file;
    // A token is a string or an AddedToken object {"content": ...}; null or
    // absent means none.
    auto token = [&](const char* key, int* id) -> absl::Status {
      auto it = tc.find(key);
      if (it == tc.end() || it->is_null()) return absl::OkStatus();
      std::string content;
      if (it->is_string()) {
        content = it->get<std::string>();
      } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        content = (*it)["content"].get<std::string>();
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(tc_path, ": ", key, " must be a string or an object with a string \"content\""));
      }
      *id = t.TokenId(content);
      if (*id < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(tc_path, ": ", key, " ", json(content).dump(), " is not a token of tokenizer.json"));
      }
      return absl::OkStatus();
    };
    RLMESH_RETURN_IF_ERROR(token("bos_token", &out.bos));
    RLMESH_RETURN_IF_ERROR(token("eos_token", &out.eos));
    RLMESH_RETURN_IF_ERROR(token("pad_token", &out.pad));
    read.push_back(out.eos >= 0 ? absl::StrCat(tc_path, " eos_token ", json(t.Decode({out.eos})).dump())
                                : absl::StrCat(tc_path, " (no eos_token)"));
  } else {
    read.push_back(absl::StrCat(tc_path, " (absent)"));
  }
  const std::string gc_path = dir + "/generation_config.json";
  absl::StatusOr<json> gc_file = ReadJsonObjectFile(gc_path);
  if (!gc_file.ok() && !absl::IsNotFound(gc_file.status())) return gc_file.status();
  if (gc_file.ok()) {
    const json& gc = *gc_file;
    auto ids = [&](const char* key, std::vector<int>* into) -> absl::Status {
      auto it = gc.find(key);
      if (it == gc.end() || it->is_null()) return absl::OkStatus();
      std::vector<json> list = it->is_array() ? it->get<std::vector<json>>() : std::vector<json>{*it};
      for (const json& v : list) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= t.vocab_size()) {
          return absl::InvalidArgumentError(absl::StrCat(gc_path, ": ", key, " ", v.dump(),
                                                         " is not a token id of tokenizer.json (0 to ",
                                                         t.vocab_size() - 1, ")"));
        }
        into->push_back(v.get<int>());
      }
      return absl::OkStatus();
    };
    RLMESH_RETURN_IF_ERROR(ids("eos_token_id", &out.stop));
    std::vector<int> one;
    if (out.bos < 0) {
      RLMESH_RETURN_IF_ERROR(ids("bos_token_id", &one));
      if (!one.empty()) out.bos = one[0];
    }
    one.clear();
    if (out.pad < 0) {
      RLMESH_RETURN_IF_ERROR(ids("pad_token_id", &one));
      if (!one.empty()) out.pad = one[0];
    }
    read.push_back(out.stop.empty() ? absl::StrCat(gc_path, " (no eos_token_id)")
                                    : absl::StrCat(gc_path, " eos_token_id ", json(out.stop).dump()));
  } else {
    read.push_back(absl::StrCat(gc_path, " (absent)"));
  }
  std::vector<int> stop;
  for (int id : out.stop) {
    if (std::find(stop.begin(), stop.end(), id) == stop.end()) stop.push_back(id);
  }
  if (out.eos >= 0 && std::find(stop.begin(), stop.end(), out.eos) == stop.end()) stop.push_back(out.eos);
  // The primary eos (what SFT appends to a target) is the tokenizer's, else
  // generation_config.json's first.
  if (out.eos < 0 && !stop.empty()) out.eos = stop[0];
  out.stop = std::move(stop);
  out.source = absl::StrJoin(read, "; ");
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec) {
  if (spec.empty() || spec == "char") return std::unique_ptr<Tokenizer>(new CharTokenizer());
  std::string path = spec;
  if (std::filesystem::is_directory(path)) path += "/tokenizer.json";
  RLMESH_ASSIGN_OR_RETURN(std::string text, ReadWhole(path));
  static const std::string* char_json = new std::string(CharTokenizer().HfTokenizerJson());
  if (text == *char_json) return std::unique_ptr<Tokenizer>(new CharTokenizer());
  auto t = BpeTokenizer::FromJson(text);
  if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
  BpeTokenizer& bpe = **t;
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  RLMESH_ASSIGN_OR_RETURN(Specials specials, ReadSpecials(dir, bpe));
  bpe.bos_ = specials.bos;
  bpe.eos_ = specials.eos;
  bpe.pad_ = specials.pad >= 0 ? specials.pad : specials.eos;
  bpe.stop_ids_ = std::move(specials.stop);
  bpe.special_source_ = std::move(specials.source);
  bpe.source_dir_ = dir;
  // Equal hashes, equal behaviour: the special ids are part of it.
  bpe.hash_ = Sha256Hex(absl::StrCat(text, "\nspecials ", bpe.bos_, " ", bpe.eos_, " ", bpe.pad_, " stop ",
                                     absl::StrJoin(bpe.stop_ids_, ",")));
  // The chat template travels with the tokenizer into the folders we write.
  if (auto tmpl = ChatTemplateBeside(dir); tmpl.ok()) bpe.set_chat_template(*tmpl);
  return std::unique_ptr<Tokenizer>(std::move(*t));
}

std::vector<std::pair<std::string, std::string>> HfTokenizerFiles(const Tokenizer& tokenizer,
                                                                  int64_t model_max_length) {
  std::vector<std::pair<std::string, std::string>> files = {{"tokenizer.json", tokenizer.HfTokenizerJson()}};
  // A folder's own files are copied as they are: they may carry fields we do
  // not read (added_tokens_decoder, named templates, processor settings).
  const std::string dir = tokenizer.source_dir();
  if (!dir.empty()) {
    if (auto config = ReadWhole(dir + "/tokenizer_config.json"); config.ok()) {
      files.emplace_back("tokenizer_config.json", *std::move(config));
      for (const char* extra : {"chat_template.jinja", "special_tokens_map.json"}) {
        if (auto text = ReadWhole(dir + "/" + extra); text.ok()) files.emplace_back(extra, *std::move(text));
      }
      return files;
    }
  }
  auto token = [&](int id) -> json {
    if (id < 0) return nullptr;
    return tokenizer.Decode({id});
  };
  json cfg = {{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"model_max_length", model_max_length},
              {"bos_token", token(tokenizer.bos_id())},
              {"eos_token", token(tokenizer.eos_id())},
              {"pad_token", token(tokenizer.pad_id())},
              {"clean_up_tokenization_spaces", false}};
  const int unk = tokenizer.TokenId("<unk>");
  if (unk >= 0) cfg["unk_token"] = "<unk>";
  if (!tokenizer.chat_template().empty()) cfg["chat_template"] = tokenizer.chat_template();
  files.emplace_back("tokenizer_config.json", cfg.dump(2) + "\n");
  return files;
}

}  // namespace rlmesh::actor
