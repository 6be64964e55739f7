#pragma once

// Verifiable tasks: where prompts and reference answers come from. Built-in
// synthetic tasks (arithmetic, countdown) generate disjoint train and
// held-out splits from a seed; JSONL datasets read {prompt, answer} lines
// (GSM8K-style final answers); chat datasets read {"messages": [...]} lines
// (tasks/chat_data.h); text corpora hold documents for continued
// pre-training (tasks/text_corpus.h).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace rlmesh {

struct Example {
  // Stable id within its split ("train/17", "eval/3", or the JSONL line's id).
  std::string id;
  // Prompt text after the template (what the model sees).
  std::string prompt;
  // Reference answer text.
  std::string answer;
  // What an SFT stage trains on for this prompt; empty = `answer`. Differs
  // only where the task was asked for imperfect SFT data
  // (task.sft_carry_errors): verifiers and evaluation always use `answer`.
  std::string sft_target;
  // Kind chat and text: what an SFT stage trains on instead of prompt +
  // sft_target: the whole text (a rendered conversation, a document) and
  // the byte spans of it that carry loss (chat: the assistant turns; text:
  // all of it). Tokenised by the learner, which knows the tokenizer.
  std::string sft_text;
  std::vector<std::pair<int64_t, int64_t>> sft_spans;
  // Where the example came from ("path:line"), for errors; may be empty.
  std::string source;
};

// Immutable after construction; safe for concurrent use.
class Task {
 public:
  virtual ~Task() = default;
  const std::vector<Example>& train() const { return train_; }
  const std::vector<Example>& eval() const { return eval_; }
  // Verifier the task is scored with by default ("numeric_answer", ...).
  virtual std::string default_verifier() const = 0;
  // Renders every prompt through task.chat_template (MakeTask calls it).
  absl::Status RenderPrompts(const TaskConfig& config, const std::string& tokenizer_spec);

 protected:
  std::vector<Example> train_;
  std::vector<Example> eval_;
};

// Builds the task a config describes. `tokenizer_spec` is model.tokenizer
// (task.chat_template "model" reads the template beside it). Errors name the
// config field.
absl::StatusOr<std::unique_ptr<Task>> MakeTask(const TaskConfig& config, uint64_t seed,
                                              const std::string& tokenizer_spec = "");

// A seeded, resumable pass over examples: each epoch is a fresh permutation
// derived from (seed, epoch); the cursor (epoch, index) is all the state.
struct LoaderCursor {
  // Pass over the data (0-based) and position inside its permutation.
  int64_t epoch = 0;
  int64_t index = 0;
};

class PromptLoader {
 public:
  using Cursor = LoaderCursor;
  // `examples` must outlive the loader.
  PromptLoader(const std::vector<Example>* examples, uint64_t seed, Cursor cursor = Cursor());
  // The next `n` examples (wrapping into new epochs).
  std::vector<const Example*> Next(int n);
  // The next batch of `n` distinct examples, all from one epoch: when fewer
  // than `n` are left in the current epoch they are skipped and the batch
  // opens the next one (a data loader's drop_last). An RL step's prompts are
  // distinct this way (a prompt id is a group's key). n larger than the data
  // gives a batch of every example once.
  std::vector<const Example*> NextBatch(int n);
  Cursor cursor() const { return cursor_; }

 private:
  void Shuffle();
  const std::vector<Example>* examples_;
  uint64_t seed_;
  Cursor cursor_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
};

// Reads a JSONL file of objects with `prompt_field` and `answer_field`.
absl::StatusOr<std::vector<Example>> ReadJsonlExamples(const std::string& path,
                                                       const std::string& prompt_field,
                                                       const std::string& answer_field,
                                                       const std::string& split);

}  // namespace rlmesh
