// Generation on the rollout workers and scoring on the reward server: the
// prompts, the sampling parameters and their seeds. Everything here reads
// only what is constant while a stage runs, so the async producer thread
// calls it too.

#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/dynamic_sampling.h"
#include "coordinator/run_loop.h"
#include "tasks/encoding.h"

namespace rlmesh {

Prompt RunLoop::MakePrompt(const Example& e) const {
  Prompt p;
  p.set_prompt_id(e.id);
  for (int id : EncodePrompt(*tokenizer_, e.prompt)) p.add_token_ids(id);
  p.set_reference_answer(e.answer);
  return p;
}

// Seed of the rollouts of stage step `step` (1-based): keyed by the stage
// and the step, not by the rollout round, so a resumed run that redoes a
// step samples exactly what the uninterrupted run sampled.
uint64_t RunLoop::RolloutSeed(int stage_index, int64_t step) const {
  return MixSeed(MixSeed(cfg().seed(), 0x5a3d + static_cast<uint64_t>(stage_index)), static_cast<uint64_t>(step));
}

SamplingParams RunLoop::Sampling(bool greedy, uint64_t seed) const {
  SamplingParams s = cfg().rollout().sampling();
  s.set_greedy(greedy);
  s.set_seed(seed);
  if (s.stop_token_ids().empty() && tokenizer_->eos_id() >= 0) s.add_stop_token_ids(tokenizer_->eos_id());
  return s;
}

absl::StatusOr<std::vector<TrajectoryGroup>> RunLoop::Generate(const std::vector<Prompt>& prompts, int n,
                                                               const SamplingParams& sampling, bool pipeline,
                                                               int64_t round, int64_t min_version,
                                                               bool record_routing) const {
  const int workers = static_cast<int>(clients_->rollouts.size());
  std::vector<std::vector<TrajectoryGroup>> out(workers);
  RLMESH_RETURN_IF_ERROR(ParallelFor(workers, [&](int w) -> absl::Status {
    GenerateRequest req;
    req.set_experiment_id(o_.experiment_id);
    req.set_step(round);
    for (size_t i = w; i < prompts.size(); i += workers) {
      Prompt* p = req.add_prompts();
      *p = prompts[i];
      // Keyed by the prompt's place in the whole call: the same samples
      // whatever the number of workers.
      if (!p->has_stream_key()) p->set_stream_key(static_cast<int64_t>(i));
    }
    if (req.prompts_size() == 0) return absl::OkStatus();
    *req.mutable_sampling() = sampling;
    req.set_n(n);
    req.set_pipeline(pipeline);
    req.set_min_policy_version(min_version);
    req.set_decode_text(true);
    req.set_record_routing(record_routing);
    for (const auto& v : cfg().reward().verifiers()) *req.add_verifiers() = v;
    req.set_verifier_timeout_ms(cfg().reward().verifier_timeout_ms());
    // Multi-turn rollouts (training and held-out evaluation alike).
    if (!cfg().environment().address().empty()) *req.mutable_environment() = cfg().environment();
    bool not_stored = false;
    absl::Status s = clients_->rollouts[w]->Generate(req, [&](GenerateResponse& resp) -> absl::Status {
      if (pipeline && !resp.stored()) {
        not_stored = true;
        return absl::DataLossError(absl::StrCat("rollout ", w, ": group ", resp.group().group_id(), " not stored"));
      }
      out[w].push_back(std::move(*resp.mutable_group()));
      return absl::OkStatus();
    });
    if (not_stored) return s;
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("rollout ", w, " Generate: ", s.message()));
    if (static_cast<int>(out[w].size()) != req.prompts_size()) {
      return absl::DataLossError(
          absl::StrCat("rollout ", w, ": ", out[w].size(), " groups for ", req.prompts_size(), " prompts"));
    }
    return absl::OkStatus();
  }));
  std::vector<TrajectoryGroup> all;
  for (auto& v : out) {
    for (auto& g : v) all.push_back(std::move(g));
  }
  return all;
}

absl::StatusOr<StepRollouts> RunLoop::GenerateStep(const RlStage& rl, const std::vector<Prompt>& prompts,
                                                    int stage_index, int64_t step, int64_t round,
                                                    int64_t min_version) const {
  const uint64_t seed = RolloutSeed(stage_index, step);
  StepRollouts out;
  RLMESH_ASSIGN_OR_RETURN(out.groups, Generate(prompts, rl.samples_per_prompt(), Sampling(false, seed), true, round,
                                               min_version, rl.routing_replay()));
  if (rl.dynamic_sampling().mode() != "refill") return out;
  out.informative = CountInformative(out.groups);
  const int max_rounds = rl.dynamic_sampling().max_rounds() > 0 ? rl.dynamic_sampling().max_rounds() : 4;
  const int shards = std::max<int>(1, static_cast<int>(clients_->learners.size()));
  std::set<std::string> used;
  for (const Prompt& p : prompts) used.insert(p.prompt_id());
  // Every train example once, in an order fixed by (stage, step); walked
  // lazily, skipping the prompts this step has used.
  std::vector<const Example*> order;
  size_t next = 0;
  while (out.refill_rounds < max_rounds && out.informative < rl.prompts_per_step()) {
    RLMESH_RETURN_IF_ERROR(CheckCancelled());
    if (order.empty()) {
      PromptLoader refill(&task_->train(), MixSeed(MixSeed(cfg().seed(), 0x4ef1 + static_cast<uint64_t>(stage_index)),
                                                   static_cast<uint64_t>(step)));
      order = refill.NextBatch(static_cast<int>(task_->train().size()));
    }
    int64_t available = 0;
    for (size_t i = next; i < order.size(); ++i) available += used.count(order[i]->id) ? 0 : 1;
    const int n = RefillRoundSize(rl.prompts_per_step(), static_cast<int>(out.groups.size()), out.informative,
                                  available, shards);
    if (n == 0) break;  // the train split has no unused prompt left
    std::vector<Prompt> more;
    while (static_cast<int>(more.size()) < n) {
      const Example* e = order[next++];
      if (used.insert(e->id).second) more.push_back(MakePrompt(*e));
    }
    ++out.refill_rounds;
    RLMESH_ASSIGN_OR_RETURN(auto groups, Generate(more, rl.samples_per_prompt(),
                                                  Sampling(false, MixSeed(seed, static_cast<uint64_t>(out.refill_rounds))),
                                                  true, round, min_version, rl.routing_replay()));
    out.informative += CountInformative(groups);
    for (auto& g : groups) out.groups.push_back(std::move(g));
  }
  return out;
}

absl::StatusOr<ScoreResponse> RunLoop::Score(const std::vector<TrajectoryGroup>& groups) const {
  ScoreRequest req;
  req.set_experiment_id(o_.experiment_id);
  for (const auto& v : cfg().reward().verifiers()) *req.add_verifiers() = v;
  req.set_verifier_timeout_ms(cfg().reward().verifier_timeout_ms());
  for (const auto& g : groups) {
    for (const auto& t : g.samples()) {
      ScoreItem* item = req.add_items();
      item->set_item_id(t.trajectory_id());
      *item->mutable_prompt_token_ids() = t.prompt_token_ids();
      *item->mutable_completion_token_ids() = t.response_token_ids();
      item->set_reference_answer(t.reference_answer());
      item->set_max_new_tokens(cfg().rollout().sampling().max_new_tokens());
    }
  }
  return clients_->rewards[0]->Score(req);
}

}  // namespace rlmesh
