#pragma once

// Tiny policies for rollout tests: written to a Hugging Face folder with
// actor's checkpoint writer, plus the reference generation straight from
// actor/ that the worker's output is compared against.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/generate.h"
#include "proto/rollout.pb.h"

namespace rlmesh::rollout::testing {

// Hidden 32, 2 layers, vocab = the char tokenizer's, 64 positions; weights
// from `seed`. Saved (fp32) into `dir`.
absl::Status WriteTinyCheckpoint(const std::string& dir, uint64_t seed);

// The same shape as Qwen3-MoE: every layer routes over 6 experts (width 16),
// top-2 renormalised; router weights drawn N(0, 1) so that routes are
// decisive. `router_noise` > 0 adds N(0, router_noise) to the routers after
// the seeded draw (the same model, its router moved).
absl::Status WriteTinyMoeCheckpoint(const std::string& dir, uint64_t seed, double router_noise = 0);

// What actor::Generator produces for `request` on the folder's weights:
// one GroupResult per prompt, prompt_index = position in the request, routes
// recorded when the request's record_routing is set.
// `resume` (optional): per prompt, the samples to continue (partial rollout,
// see actor::GenerationRequest::resume).
absl::StatusOr<std::vector<actor::GroupResult>> ReferenceGenerate(
    const std::string& dir, const GenerateRequest& request, int64_t max_batch = 64,
    const std::vector<std::vector<actor::Completion>>* resume = nullptr);

// A request of `prompts` char-tokenized prompts.
GenerateRequest MakeRequest(const std::vector<std::string>& prompts, int n, int max_new_tokens, uint64_t seed);

}  // namespace rlmesh::rollout::testing
