#pragma once

// Conversations in the chat `messages` format ({"messages": [{"role":
// "system"|"user"|"assistant"|"tool", "content": "..."}, ...]} per JSONL
// line), rendered through a chat template, and the assistant-only loss mask
// of SFT.
//
// Assistant spans (docs/design/data.md). For each assistant message
// i of a conversation M, with R(x, g) the template's rendering of messages x
// (g = add_generation_prompt):
//   A = R(M[:i], true)     the conversation so far plus the assistant header
//   B = R(M[:i+1], false)  the same with message i rendered
//   F = R(M, false)        the whole conversation (what is tokenised)
// B must be a prefix of F (a template that renders earlier turns differently
// once later turns follow, as Qwen3's does for reasoning, is refused for that
// conversation with an error naming it). The span of message i is [start,
// end) with start = the length of the common prefix of A and B (where the
// rendering of the message departs from a bare generation prompt: the
// header stays out even when the generation prompt adds more, e.g. an empty
// think block) and end = len(B) less trailing whitespace (the "\n" after
// <|im_end|> is not something the model generates; the end-of-turn token
// is). An assistant message first in a conversation has nothing before it
// to render and is refused.
//
// Spans to tokens. The ids are exactly Encode(F). A token is trained on when
// its bytes overlap a span; a token that straddles a span boundary is
// therefore trained on, as transformers' return_assistant_tokens_mask does
// (char_to_token of the span's first and last characters). Token byte ranges
// come from decoding: the ids are decoded in the shortest windows that give
// back the text byte for byte, so a character split over several byte-level
// tokens gives each of them the character's range. A tokenizer that does not
// give back the text (a normalizer that changes it, characters outside the
// char tokenizer's set) is refused with an error naming the byte offset.
//
// Plain functions; no state. Errors are INVALID_ARGUMENT naming "path:line"
// and the field.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tasks/chat_prompts.h"

namespace rlmesh {

// One line of a chat JSONL file.
struct ChatRecord {
  // "path:line", for errors.
  std::string where;
  // The validated messages array.
  nlohmann::ordered_json messages;
  // The record's `tools` (an array of schemas), or null.
  nlohmann::ordered_json tools;
  // The whole line (other fields: answer, id, ...).
  nlohmann::ordered_json record;
};

// Checks a messages array: non-empty; each an object whose role is system,
// user, assistant or tool and whose content is a string (an assistant
// message with tool_calls may have null or no content). `where` prefixes
// errors ("f.jsonl:3: messages[1].role: ...").
absl::Status CheckMessages(const nlohmann::ordered_json& messages, const std::string& where,
                           const std::string& field);

// Reads JSONL lines with an array in `messages_field`. Blank lines are
// skipped; a file with no records is INVALID_ARGUMENT.
absl::StatusOr<std::vector<ChatRecord>> ReadChatJsonl(const std::string& path, const std::string& messages_field);

// Byte range [begin, end) of a text.
struct ByteSpan {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const ByteSpan& o) const { return begin == o.begin && end == o.end; }
};

struct RenderedChat {
  // R(messages, false).
  std::string text;
  // One span per assistant message with any text, in order.
  std::vector<ByteSpan> assistant;
};

// The rendering and its assistant spans (see the top of this file).
absl::StatusOr<RenderedChat> RenderWithAssistantSpans(const ChatRenderer& renderer,
                                                      const nlohmann::ordered_json& messages,
                                                      const nlohmann::ordered_json& tools = nullptr);

// The RL prompt of a conversation: its messages up to and including the last
// user turn, rendered with the assistant header. INVALID_ARGUMENT when there
// is no user turn.
absl::StatusOr<std::string> RenderChatPrompt(const ChatRenderer& renderer, const nlohmann::ordered_json& messages,
                                             const nlohmann::ordered_json& tools = nullptr);

// The byte range of each token of `ids` = Encode(text) in `text`.
absl::StatusOr<std::vector<ByteSpan>> TokenByteSpans(const actor::Tokenizer& tokenizer, const std::vector<int>& ids,
                                                     const std::string& text);

struct TokenizedChat {
  // [bos] (when the tokenizer has one: the house convention of
  // tasks/encoding.h) + Encode(text).
  std::vector<int> ids;
  // Per id: 1 when the token is trained on (it overlaps a span), else 0.
  // The bos is never trained on.
  std::vector<uint8_t> loss;
};

// Tokenises `text` and marks the tokens that overlap `spans`.
absl::StatusOr<TokenizedChat> TokenizeWithSpans(const actor::Tokenizer& tokenizer, const std::string& text,
                                                const std::vector<ByteSpan>& spans);

}  // namespace rlmesh
