#include "tasks/encoding.h"

namespace rlmesh {

std::vector<int> EncodePrompt(const actor::Tokenizer& tokenizer, const std::string& prompt) {
  std::vector<int> ids;
  if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
  for (int id : tokenizer.Encode(prompt)) ids.push_back(id);
  return ids;
}

std::vector<int> EncodeResponse(const actor::Tokenizer& tokenizer, const std::string& answer) {
  std::vector<int> ids = tokenizer.Encode(answer);
  if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
  return ids;
}

}  // namespace rlmesh
