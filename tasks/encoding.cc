#include "tasks/encoding.h"

namespace rlmesh {

std::vector<int> EncodePrompt(const actor::Tokenizer& tokenizer, const std::string& prompt) {
  std::vector<int> text = tokenizer.Encode(prompt);
  // The BOS opens the prompt unless the text already encodes to it first: a
  // chat template that writes it (Llama 3's) has put it there, and
  // transformers' apply_chat_template adds none of its own.
  const int bos = tokenizer.bos_id();
  if (bos < 0 || (!text.empty() && text.front() == bos)) return text;
  std::vector<int> ids = {bos};
  ids.insert(ids.end(), text.begin(), text.end());
  return ids;
}

std::vector<int> EncodeResponse(const actor::Tokenizer& tokenizer, const std::string& answer) {
  std::vector<int> ids = tokenizer.Encode(answer);
  if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
  return ids;
}

}  // namespace rlmesh
