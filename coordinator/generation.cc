// Generation on the rollout workers and scoring on the reward server: the
// prompts, the sampling parameters and their seeds. Everything here reads
// only what is constant while a stage runs, so the async producer thread
// calls it too.

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/dynamic_sampling.h"
#include "coordinator/run_loop.h"
#include "tasks/encoding.h"

namespace rlmesh {
namespace {

// "a,b,c" for a log line; the first 16 ids and a count beyond.
std::string PromptIds(const std::vector<Prompt>& prompts) {
  std::string out;
  for (size_t i = 0; i < prompts.size() && i < 16; ++i) absl::StrAppend(&out, i ? "," : "", prompts[i].prompt_id());
  if (prompts.size() > 16) absl::StrAppend(&out, ",+", prompts.size() - 16);
  return out;
}

}  // namespace

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
  // The experiment's own stop ids, else every stop id of the model folder
  // (RunStages refused a run with neither).
  if (s.stop_token_ids().empty()) {
    for (int id : tokenizer_->stop_ids()) s.add_stop_token_ids(id);
  }
  return s;
}

// Long because: the per-worker dispatch threads (a lambda), the redispatch of a timed-out worker's
// prompts and the final check share the call's state declared at the top.
absl::StatusOr<std::vector<TrajectoryGroup>> RunLoop::Generate(const std::vector<Prompt>& prompts, int n,
                                                               const SamplingParams& sampling, bool pipeline,
                                                               int64_t round, int64_t min_version,
                                                               bool record_routing, StragglerCounts* counts) const {
  const int workers = static_cast<int>(clients_->rollouts.size());
  const RolloutConfig& rc = cfg().rollout();
  const absl::Duration timeout =
      rc.request_timeout_ms() > 0 ? absl::Milliseconds(rc.request_timeout_ms()) : absl::InfiniteDuration();
  const bool redispatch = rc.on_timeout() != "drop";
  // Shared by the per-worker threads of this call: which workers timed out
  // (never a redispatch target again in this call) and what happened.
  absl::Mutex mu;
  std::vector<bool> timed_out(workers, false);
  StragglerCounts local;
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
    if (pipeline) *req.mutable_reward_call() = cfg().reward().call();
    // Multi-turn rollouts (training and held-out evaluation alike).
    if (!cfg().environment().address().empty()) *req.mutable_environment() = cfg().environment();
    // Prompts of this slice whose group came back (or was dropped by the
    // reward policy): what a redispatch leaves out, and what keeps a group
    // from counting twice.
    std::set<std::string> done;
    int reward_dropped = 0;
    int target = w;
    for (;;) {
      // Groups of this call the worker did not store: dropped by the reward
      // policy if the call then ends OK, else lost to the call's error.
      std::vector<std::pair<std::string, std::string>> unstored;  // (prompt id, group id)
      absl::Status s = clients_->rollouts[target]->Generate(req, timeout, [&](GenerateResponse& resp) -> absl::Status {
        if (pipeline && !resp.stored()) {
          unstored.emplace_back(resp.group().prompt_id(), resp.group().group_id());
          return absl::OkStatus();
        }
        if (done.insert(resp.group().prompt_id()).second) out[w].push_back(std::move(*resp.mutable_group()));
        return absl::OkStatus();
      });
      if (s.ok()) {
        for (const auto& [prompt_id, group_id] : unstored) {
          if (!done.insert(prompt_id).second) continue;
          ++reward_dropped;
          RLMESH_LOG(WARNING) << "rollout worker=" << target << " round=" << round << " group=" << group_id
                              << " dropped by reward.call.on_failure";
        }
        break;
      }
      const bool straggler = s.code() == absl::StatusCode::kDeadlineExceeded && timeout != absl::InfiniteDuration();
      if (!unstored.empty() && !straggler) {
        return absl::DataLossError(absl::StrCat("rollout ", target, ": group ", unstored[0].second,
                                                " not stored: ", s.message()));
      }
      if (!straggler) {
        return absl::Status(s.code(), absl::StrCat("rollout ", target, " Generate: ", s.message()));
      }
      // A straggler: its call was cancelled at the deadline. The prompts
      // still missing keep their ids, stream keys and round, so wherever
      // they run they sample and are keyed as they would have been.
      std::vector<Prompt> missing;
      for (const Prompt& p : req.prompts()) {
        if (!done.count(p.prompt_id())) missing.push_back(p);
      }
      int next = -1;
      {
        absl::MutexLock lock(&mu);
        timed_out[target] = true;
        ++local.timed_out_requests;
        for (int k = 1; k < workers && redispatch; ++k) {
          const int v = (target + k) % workers;
          if (!timed_out[v]) {
            next = v;
            break;
          }
        }
        if (!redispatch) local.dropped_prompts += static_cast<int>(missing.size());
        if (next >= 0) local.redispatched_prompts += static_cast<int>(missing.size());
      }
      if (!redispatch) {
        RLMESH_LOG(WARNING) << "rollout straggler worker=" << target << " round=" << round
                            << " timeout_ms=" << rc.request_timeout_ms() << " missing=" << missing.size()
                            << " prompts=" << PromptIds(missing) << " action=drop";
        break;
      }
      if (next < 0) {
        return absl::DeadlineExceededError(absl::StrCat("rollout ", target, " Generate: no answer within ",
                                                        rc.request_timeout_ms(), " ms (rollout.request_timeout_ms)"
                                                        " and no worker left to redispatch ", missing.size(),
                                                        " prompts to"));
      }
      RLMESH_LOG(WARNING) << "rollout straggler worker=" << target << " round=" << round
                          << " timeout_ms=" << rc.request_timeout_ms() << " missing=" << missing.size()
                          << " prompts=" << PromptIds(missing) << " action=redispatch to_worker=" << next;
      if (missing.empty()) break;  // every group had arrived: only the end was late
      req.clear_prompts();
      for (Prompt& p : missing) *req.add_prompts() = std::move(p);
      target = next;
    }
    {
      absl::MutexLock lock(&mu);
      local.dropped_groups += reward_dropped;
    }
    return absl::OkStatus();
  }));
  if (counts != nullptr) {
    counts->timed_out_requests += local.timed_out_requests;
    counts->redispatched_prompts += local.redispatched_prompts;
    counts->dropped_prompts += local.dropped_prompts;
    counts->dropped_groups += local.dropped_groups;
  }
  std::vector<TrajectoryGroup> all;
  for (auto& v : out) {
    for (auto& g : v) all.push_back(std::move(g));
  }
  // Every prompt has its group, unless dropped on purpose.
  const size_t expected = prompts.size() - static_cast<size_t>(local.dropped_prompts + local.dropped_groups);
  if (all.size() != expected) {
    return absl::DataLossError(absl::StrCat("rollout: ", all.size(), " groups for ", expected, " prompts"));
  }
  return all;
}

absl::StatusOr<StepRollouts> RunLoop::GenerateStep(const RlStage& rl, const std::vector<Prompt>& prompts,
                                                    int stage_index, int64_t step, int64_t round,
                                                    int64_t min_version) const {
  const uint64_t seed = RolloutSeed(stage_index, step);
  StepRollouts out;
  RLMESH_ASSIGN_OR_RETURN(out.groups, Generate(prompts, rl.samples_per_prompt(), Sampling(false, seed), true, round,
                                               min_version, rl.routing_replay(), &out.stragglers));
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
                                                  true, round, min_version, rl.routing_replay(),
                                                  &out.stragglers));
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
  return clients_->rewards[0]->Score(req, absl::InfiniteDuration());
}

}  // namespace rlmesh
