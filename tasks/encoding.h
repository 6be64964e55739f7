#pragma once

// How a task's text becomes token ids — the one convention SFT, rollout,
// the learner and evaluation all share, so that the prompt a policy was
// trained on is byte-for-byte the prompt it is asked:
//   prompt ids   = [bos] + Encode(prompt)        (no bos if the tokenizer has none,
//                                                 or if Encode(prompt) starts with it:
//                                                 a chat template wrote it)
//   response ids = Encode(answer) + [eos]        (SFT targets; rollouts stop at eos)

#include <string>
#include <vector>

#include "actor/tokenizer.h"

namespace rlmesh {

std::vector<int> EncodePrompt(const actor::Tokenizer& tokenizer, const std::string& prompt);
std::vector<int> EncodeResponse(const actor::Tokenizer& tokenizer, const std::string& answer);

}  // namespace rlmesh
