#include "tasks/chat_data.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace rlmesh {
namespace {

using Json = nlohmann::ordered_json;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int64_t CommonPrefix(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

Json Prefix(const Json& messages, size_t n) {
  Json out = Json::array();
  for (size_t i = 0; i < n; ++i) out.push_back(messages[i]);
  return out;
}

}  // namespace

absl::Status CheckMessages(const Json& messages, const std::string& where, const std::string& field) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, what));
  };
  if (!messages.is_array()) return bad(": must be an array of messages");
  if (messages.empty()) return bad(": is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string at = absl::StrCat("[", i, "]");
    if (!m.is_object()) return bad(at + ": must be an object with role and content");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return bad(at + ".role: missing or not a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      return bad(absl::StrCat(at, ".role: \"", r, "\" is not system, user, assistant or tool"));
    }
    auto content = m.find("content");
    const bool calls = r == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array();
    if (content == m.end() || content->is_null()) {
      if (!calls) return bad(at + ".content: missing (only an assistant turn with tool_calls may omit it)");
    } else if (!content->is_string()) {
      return bad(at + ".content: must be a string (content parts are not supported)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChatRecord>> ReadChatJsonl(const std::string& path, const std::string& messages_field) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read dataset ", path));
  std::vector<ChatRecord> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ChatRecord rec;
    rec.where = absl::StrCat(path, ":", lineno);
    rec.record = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (rec.record.is_discarded() || !rec.record.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(rec.where, ": not a JSON object"));
    }
    auto it = rec.record.find(messages_field);
    if (it == rec.record.end()) {
      return absl::InvalidArgumentError(absl::StrCat(rec.where, ": missing field '", messages_field, "'"));
    }
    if (absl::Status s = CheckMessages(*it, rec.where, messages_field); !s.ok()) return s;
    rec.messages = *it;
    auto tools = rec.record.find("tools");
    if (tools != rec.record.end() && !tools->is_null()) {
      if (!tools->is_array()) return absl::InvalidArgumentError(absl::StrCat(rec.where, ": tools: must be an array"));
      rec.tools = *tools;
    }
    out.push_back(std::move(rec));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
  return out;
}

absl::StatusOr<RenderedChat> RenderWithAssistantSpans(const ChatRenderer& renderer, const Json& messages,
                                                      const Json& tools) {
  RenderedChat out;
  auto full = renderer.Render(messages, false, tools);
  if (!full.ok()) return full.status();
  out.text = *std::move(full);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].value("role", "") != "assistant") continue;
    if (i == 0) {
      return absl::InvalidArgumentError(
          "messages[0]: an assistant turn first has no conversation before it to find its span from");
    }
    auto a = renderer.Render(Prefix(messages, i), true, tools);
    if (!a.ok()) return a.status();
    auto b = renderer.Render(Prefix(messages, i + 1), false, tools);
    if (!b.ok()) return b.status();
    if (out.text.compare(0, b->size(), *b) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i, "]: the template renders the conversation up to this assistant turn differently once later "
          "turns follow (at byte ", CommonPrefix(out.text, *b), "), so its span cannot be found; split the "
          "conversation at this turn"));
    }
    ByteSpan span{CommonPrefix(*a, *b), static_cast<int64_t>(b->size())};
    while (span.end > span.begin && IsSpace((*b)[span.end - 1])) --span.end;
    if (span.end > span.begin) out.assistant.push_back(span);
  }
  return out;
}

absl::StatusOr<std::string> RenderChatPrompt(const ChatRenderer& renderer, const Json& messages, const Json& tools) {
  size_t last_user = messages.size();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].value("role", "") == "user") last_user = i;
  }
  if (last_user == messages.size()) return absl::InvalidArgumentError("messages: no user turn to prompt with");
  return renderer.Render(Prefix(messages, last_user + 1), true, tools);
}

absl::StatusOr<std::vector<ByteSpan>> TokenByteSpans(const actor::Tokenizer& tokenizer, const std::vector<int>& ids,
                                                     const std::string& text) {
  // A window longer than this never gives back whole characters (a UTF-8
  // character is at most 4 bytes, so 4 byte-level tokens).
  constexpr size_t kMaxWindow = 16;
  std::vector<ByteSpan> out(ids.size());
  int64_t pos = 0;
  size_t start = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string piece = tokenizer.Decode(std::vector<int>(ids.begin() + start, ids.begin() + k + 1));
    if (text.compare(pos, piece.size(), piece) == 0) {
      const int64_t end = pos + static_cast<int64_t>(piece.size());
      for (size_t j = start; j <= k; ++j) out[j] = {pos, end};
      pos = end;
      start = k + 1;
    } else if (k + 1 - start >= kMaxWindow) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the tokenizer does not give back the text at byte ", pos,
          " (a normalizer that changes it, or characters the tokenizer does not have); token spans cannot be found"));
    }
  }
  if (start != ids.size() || pos != static_cast<int64_t>(text.size())) {
    return absl::InvalidArgumentError(absl::StrCat("the tokenizer does not give back the text from byte ", pos,
                                                   " of ", text.size(), "; token spans cannot be found"));
  }
  return out;
}

absl::StatusOr<TokenizedChat> TokenizeWithSpans(const actor::Tokenizer& tokenizer, const std::string& text,
                                                const std::vector<ByteSpan>& spans) {
  const std::vector<int> ids = tokenizer.Encode(text);
  auto ranges = TokenByteSpans(tokenizer, ids, text);
  if (!ranges.ok()) return ranges.status();
  TokenizedChat out;
  if (tokenizer.bos_id() >= 0) {
    out.ids.push_back(tokenizer.bos_id());
    out.loss.push_back(0);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const ByteSpan& t = (*ranges)[i];
    bool in = false;
    for (const ByteSpan& s : spans) in = in || (t.begin < s.end && s.begin < t.end);
    out.ids.push_back(ids[i]);
    out.loss.push_back(in ? 1 : 0);
  }
  return out;
}

}  // namespace rlmesh
