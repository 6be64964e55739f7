#pragma once

// Private to the Trainer's files (trainer.cc, sft_step.cc, pairs_step.cc,
// rl_step.cc, trainer_checkpoint.cc): the per-stage state and small helpers.

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "actor/tokenizer.h"
#include "learner/batching.h"
#include "learner/model_set.h"
#include "learner/stage_options.h"
#include "learner/trainer.h"
#include "proto/learner.pb.h"
#include "tasks/preferences.h"
#include "tasks/task.h"

namespace rlmesh::learner {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs `fn`, turning LibTorch/STL exceptions into INTERNAL.
template <typename Fn>
auto CatchAll(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

// splitmix64: derives independent seeds from (seed, salt).
inline uint64_t Mix(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (salt + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Everything one configured stage holds. Owned by the Trainer; touched only
// by the thread that calls it.
struct Trainer::State {
  ConfigureRequest request;
  StageOptions opt;
  int rank = 0, world = 1;
  // The data-parallel replica this rank belongs to and their number
  // (rank / learner.tp, world / learner.tp): a replica's tensor-parallel
  // ranks train on the same slice of the global batch.
  int data_rank = 0, data_world = 1;

  std::unique_ptr<actor::Tokenizer> tokenizer;
  std::unique_ptr<Task> task;
  uint64_t loader_seed = 0;
  std::unique_ptr<PromptLoader> loader;
  // What `loader` walks: the task's train split, or `pair_keys`.
  const std::vector<Example>* loader_data = nullptr;

  ModelSet models;

  // SFT on task kind chat or text: the tokenised training items, one per
  // key the loader walks (chat: the task's train examples; text:
  // `sft_row_keys`). A chat item is one sequence (its loss marks the
  // assistant tokens); a text item is one packed row of document pieces.
  std::vector<std::vector<Seq>> sft_items;
  bool sft_items_are_rows = false;
  std::vector<Example> sft_row_keys;

  // Reward model and DPO: the pairs, and one Example per pair (id = index)
  // for the loader.
  std::vector<PreferencePair> pairs;
  std::vector<Example> pair_keys;
};

}  // namespace rlmesh::learner
