#pragma once

// Preference pairs for reward-model and DPO training: a prompt with a
// preferred ("chosen") and a dispreferred ("rejected") response, as text.
// They are tokenised with tasks/encoding.h like every other sequence:
// prompt ids = [bos] + Encode(prompt), response ids = Encode(text) + [eos].
//
// Pairs come from a JSONL file ({"prompt", "chosen", "rejected"} per line, or
// token ids {"prompt_token_ids", "chosen_token_ids", "rejected_token_ids"} as
// the replay buffer's DPO export writes them: RL trajectories become
// preference data without a round trip through text) or
// are synthesised from a verifiable task whose answers are integers: chosen =
// the reference answer, rejected = the answer plus a seeded nonzero offset
// (a near miss, the hard kind of wrong answer).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tasks/chat_prompts.h"
#include "tasks/task.h"

namespace rlmesh {

struct PreferencePair {
  // Prompt text after the template (what the model sees).
  std::string prompt;
  // Preferred and dispreferred responses (text, no eos).
  std::string chosen;
  std::string rejected;
  // Set when the pair came as token ids: used as they are (the prompt ids
  // include bos, the responses any eos they were sampled with); the text
  // fields are then empty.
  std::vector<int> prompt_ids;
  std::vector<int> chosen_ids;
  std::vector<int> rejected_ids;
  bool has_ids() const { return !prompt_ids.empty(); }
};

struct TaskPairOptions {
  // Seed of the offsets; pair i depends only on (seed, i). Default 0.
  uint64_t seed = 0;
  // Rejected = answer + d with d uniform in [-max_offset, -1] U [1,
  // max_offset]; must be >= 1. Default 10.
  int64_t max_offset = 10;

  absl::Status Validate() const;
};

// One pair per example, in order. INVALID_ARGUMENT naming the example id when
// an answer is not an integer.
absl::StatusOr<std::vector<PreferencePair>> MakeTaskPreferencePairs(const std::vector<Example>& examples,
                                                                    const TaskPairOptions& options);

// Reads JSONL lines {"prompt": str, "chosen": str, "rejected": str} (numbers
// are accepted as their JSON text; blank lines skipped). Errors name
// "path:line" and the field; a file with no pairs is INVALID_ARGUMENT.
//
// With a `renderer` (the task's chat template), lines may be in the chat
// format too: "prompt" a messages array (rendered with the assistant header,
// as an RL prompt is), "chosen"/"rejected" each a text or a messages array
// that continues the prompt (usually one assistant turn). A continuation is
// rendered after the prompt and its text is what the template writes for it
// from where it departs from the bare generation prompt, less trailing
// whitespace and the tokenizer's eos token at its end (EncodeResponse adds
// the eos back). A line in the chat format without a renderer is refused.
absl::StatusOr<std::vector<PreferencePair>> ReadPreferencePairs(const std::string& path,
                                                                const ChatRenderer* renderer = nullptr);

// The pairs as JSONL (the format ReadPreferencePairs reads).
std::string PreferencePairsToJsonl(const std::vector<PreferencePair>& pairs);

}  // namespace rlmesh
