#include "tasks/preferences.h"

#include <cstdint>
#include <fstream>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tasks/chat_data.h"

namespace rlmesh {

absl::Status TaskPairOptions::Validate() const {
  if (max_offset < 1) return absl::InvalidArgumentError("max_offset: must be >= 1");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PreferencePair>> MakeTaskPreferencePairs(const std::vector<Example>& examples,
                                                                    const TaskPairOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::vector<PreferencePair> out;
  out.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& e = examples[i];
    int64_t answer = 0;
    if (!absl::SimpleAtoi(e.answer, &answer)) {
      return absl::InvalidArgumentError(
          absl::StrCat("example ", e.id, ": answer \"", e.answer, "\" is not an integer (task pairs need one)"));
    }
    // One generator per pair: pair i does not depend on how many came before.
    std::mt19937_64 rng(options.seed * 0x9e3779b97f4a7c15ULL + i);
    std::uniform_int_distribution<int64_t> dist(1, options.max_offset);
    int64_t offset = dist(rng);
    if (rng() & 1) offset = -offset;
    out.push_back({e.prompt, e.answer, absl::StrCat(answer + offset)});
  }
  return out;
}

namespace {

using OJson = nlohmann::ordered_json;

int64_t CommonPrefix(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

// A chat-format pair: prompt messages, and each response a text or the
// messages that continue the prompt.
absl::Status ReadChatPair(const OJson& j, const std::string& where, const ChatRenderer& renderer, PreferencePair* p) {
  if (absl::Status s = CheckMessages(j["prompt"], where, "prompt"); !s.ok()) return s;
  auto prompt = renderer.Render(j["prompt"], /*add_generation_prompt=*/true);
  if (!prompt.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": prompt: ", prompt.status().message()));
  p->prompt = *prompt;
  for (const char* side : {"chosen", "rejected"}) {
    std::string* out = std::string(side) == "chosen" ? &p->chosen : &p->rejected;
    auto it = j.find(side);
    if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat(where, ": missing field '", side, "'"));
    if (it->is_string()) {
      *out = it->get<std::string>();
      continue;
    }
    if (absl::Status s = CheckMessages(*it, where, side); !s.ok()) return s;
    OJson all = j["prompt"];
    for (const auto& m : *it) all.push_back(m);
    auto full = renderer.Render(all, /*add_generation_prompt=*/false);
    if (!full.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", side, ": ", full.status().message()));
    auto bare = renderer.Render(j["prompt"], /*add_generation_prompt=*/false);
    if (!bare.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": prompt: ", bare.status().message()));
    if (full->compare(0, bare->size(), *bare) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", side, ": the template renders the prompt differently once this reply follows"));
    }
    int64_t begin = CommonPrefix(*prompt, *full), end = static_cast<int64_t>(full->size());
    while (end > begin && std::string(" \t\r\n").find((*full)[end - 1]) != std::string::npos) --end;
    const std::optional<std::string>& eos = renderer.eos_token();
    if (eos && !eos->empty() && end - begin >= static_cast<int64_t>(eos->size()) &&
        full->compare(end - eos->size(), eos->size(), *eos) == 0) {
      end -= static_cast<int64_t>(eos->size());
    }
    *out = full->substr(begin, end - begin);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<PreferencePair>> ReadPreferencePairs(const std::string& path,
                                                                const ChatRenderer* renderer) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read preference pairs ", path));
  std::vector<PreferencePair> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": not a JSON object"));
    }
    auto field = [&](const char* name, std::string* value) -> absl::Status {
      auto it = j.find(name);
      if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": missing field '", name, "'"));
      if (it->is_string()) {
        *value = it->get<std::string>();
      } else if (it->is_number()) {
        *value = it->dump();
      } else {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": field '", name, "' is not a string or number"));
      }
      return absl::OkStatus();
    };
    PreferencePair p;
    if (j.contains("prompt_token_ids")) {
      auto ids = [&](const char* name, std::vector<int>* out) -> absl::Status {
        auto it = j.find(name);
        if (it == j.end() || !it->is_array() || it->empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ":", lineno, ": field '", name, "' must be a non-empty array of token ids"));
        }
        for (const auto& v : *it) {
          if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
            return absl::InvalidArgumentError(
                absl::StrCat(path, ":", lineno, ": field '", name, "' holds ", v.dump(), ", not a token id"));
          }
          out->push_back(v.get<int>());
        }
        return absl::OkStatus();
      };
      if (absl::Status s = ids("prompt_token_ids", &p.prompt_ids); !s.ok()) return s;
      if (absl::Status s = ids("chosen_token_ids", &p.chosen_ids); !s.ok()) return s;
      if (absl::Status s = ids("rejected_token_ids", &p.rejected_ids); !s.ok()) return s;
      out.push_back(std::move(p));
      continue;
    }
    if (j.contains("prompt") && j["prompt"].is_array()) {
      const std::string where = absl::StrCat(path, ":", lineno);
      if (renderer == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": prompt: a messages array needs a chat template (set task.chat_template)"));
      }
      if (absl::Status s = ReadChatPair(OJson::parse(line), where, *renderer, &p); !s.ok()) return s;
      out.push_back(std::move(p));
      continue;
    }
    if (absl::Status s = field("prompt", &p.prompt); !s.ok()) return s;
    if (absl::Status s = field("chosen", &p.chosen); !s.ok()) return s;
    if (absl::Status s = field("rejected", &p.rejected); !s.ok()) return s;
    out.push_back(std::move(p));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no preference pairs"));
  return out;
}

std::string PreferencePairsToJsonl(const std::vector<PreferencePair>& pairs) {
  std::string out;
  for (const PreferencePair& p : pairs) {
    nlohmann::json j = p.has_ids() ? nlohmann::json{{"prompt_token_ids", p.prompt_ids},
                                                    {"chosen_token_ids", p.chosen_ids},
                                                    {"rejected_token_ids", p.rejected_ids}}
                                   : nlohmann::json{{"prompt", p.prompt}, {"chosen", p.chosen}, {"rejected", p.rejected}};
    absl::StrAppend(&out, j.dump(), "\n");
  }
  return out;
}

}  // namespace rlmesh
