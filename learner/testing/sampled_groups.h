#pragma once

// Test helpers: a task's prompts, and GRPO groups sampled from a model as a
// rollout worker would send them (prompt and response ids, behaviour
// log-probs, a loss mask of ones, a reward per sample).

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actor/generate.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "proto/config.pb.h"
#include "proto/learner.pb.h"
#include "tasks/encoding.h"
#include "tasks/task.h"

namespace rlmesh::learner::testing {

// `count` training prompts of the experiment's task (its first eight, in
// turn), encoded with the character tokenizer.
inline std::vector<std::vector<int>> TaskPrompts(const ExperimentConfig& e, int count) {
  auto task = MakeTask(e.task(), e.seed());
  REQUIRE(task.ok());
  actor::CharTokenizer tok;
  std::vector<std::vector<int>> out;
  for (int i = 0; i < count; ++i) out.push_back(EncodePrompt(tok, (*task)->train()[i % 8].prompt));
  return out;
}

// `n` samples of each prompt from `model` (at most 4 new tokens, stop id 2,
// sampling seed `seed`), one group per prompt, each sample rewarded by
// `reward` of its response tokens.
inline GroupList SampleGroups(actor::Transformer& model, const std::vector<std::vector<int>>& prompts, int n,
                              float temperature, uint64_t seed,
                              const std::function<double(const std::vector<int64_t>&)>& reward) {
  actor::Generator gen(model);
  std::vector<actor::GenerationRequest> reqs;
  for (size_t p = 0; p < prompts.size(); ++p) {
    actor::GenerationRequest r;
    r.id = p;
    r.prompt.assign(prompts[p].begin(), prompts[p].end());
    r.sampling.temperature = temperature;
    r.sampling.max_new_tokens = 4;
    r.sampling.stop_token_ids = {2};
    r.sampling.seed = seed;
    r.sampling.n = n;
    r.prompt_index = p;
    reqs.push_back(r);
  }
  torch::NoGradGuard no_grad;
  auto out = gen.Generate(reqs);
  REQUIRE(out.ok());
  GroupList groups;
  for (size_t p = 0; p < out->size(); ++p) {
    auto* g = groups.add_groups();
    g->set_group_id(std::to_string(p));
    for (const auto& c : (*out)[p].samples) {
      auto* tr = g->add_samples();
      for (int id : prompts[p]) tr->add_prompt_token_ids(id);
      for (int64_t id : c.tokens) tr->add_response_token_ids(static_cast<int>(id));
      for (float lp : c.logprobs) tr->add_behaviour_logprobs(lp);
      for (size_t j = 0; j < c.tokens.size(); ++j) tr->add_loss_mask(1);
      tr->set_reward(reward(c.tokens));
    }
  }
  return groups;
}

}  // namespace rlmesh::learner::testing
