// Asynchronous RL (max_staleness = k > 0). A producer thread generates the
// groups of stage step i (pipeline mode: worker -> reward -> buffer) as soon
// as the weights of step i-1-k are in the workers, while the run thread
// trains and syncs the steps before it. The learner takes step i's groups
// FIFO with min_policy_version = its version - k, so no trained group is
// more than k versions stale, and the stored behaviour log-probs correct for
// the lag. A weight update waits at the workers' fence for the sequences in
// flight (rollout.on_update), so with k = 1 generation of step i+1 overlaps
// training of step i: a step costs max(generate, train) + sync instead of
// their sum.

#include <cmath>
#include <map>
#include <thread>

#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "coordinator/experiment_config.h"
#include "coordinator/run_loop.h"

namespace rlmesh {
namespace {

// What the producer thread shares with the run thread.
struct AsyncRollout {
  // What the producer measured while generating one stage step.
  struct Generated {
    double reward_sum = 0, reward_sq = 0, length_sum = 0, seconds = 0;
    int count = 0;
    // Groups generated (the learner takes exactly these when refilling),
    // refill rounds run and informative groups.
    int groups = 0, refill_rounds = 0, informative = 0;
    // Oldest version the workers were asked to hold (the step's policy).
    int64_t min_version = 0;
    StragglerCounts stragglers;
  };
  absl::Mutex mu;
  // Stage steps whose groups are all stored in the buffer.
  int64_t produced ABSL_GUARDED_BY(mu) = 0;
  // Stage steps trained and synced into the workers, and the workers'
  // version after each of them.
  int64_t synced ABSL_GUARDED_BY(mu) = 0;
  std::map<int64_t, int64_t> version_after ABSL_GUARDED_BY(mu);
  std::map<int64_t, Generated> generated ABSL_GUARDED_BY(mu);
  // The producer's first error; it stops there.
  absl::Status error ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  // Started and joined by the run thread only.
  std::thread thread;

  void Stop() {
    {
      absl::MutexLock lock(&mu);
      stop = true;
    }
    if (thread.joinable()) thread.join();
  }
  ~AsyncRollout() { Stop(); }
};

}  // namespace

// Long because: the producer (a lambda on its own thread) and the step loop that consumes what it
// generates share the state declared at the top; the producer is a third of it.
absl::Status RunLoop::RunRlAsync(const Stage& stage) {
  const RlStage& rl = *RlSettings(stage);
  const int64_t total = rl.steps();
  const int64_t k = rl.max_staleness();
  const int stage_index = stage_index_;
  // Owned by the producer thread while it runs; rewound by start() before.
  PromptLoader loader(&task_->train(), cfg().seed() * 7919 + stage_index);
  AsyncRollout a;

  // (Re)starts the producer at the step after stage_step_. Run thread.
  auto start = [&] {
    const int64_t first = stage_step_ + 1;
    const int64_t global_base = global_step_ - stage_step_;
    loader = PromptLoader(&task_->train(), cfg().seed() * 7919 + stage_index);
    for (int64_t done = 0; done < stage_step_; ++done) loader.NextBatch(rl.prompts_per_step());
    {
      absl::MutexLock lock(&a.mu);
      a.produced = a.synced = stage_step_;
      a.version_after.clear();
      a.version_after[stage_step_] = versions_.rollout();
      a.generated.clear();
      a.error = absl::OkStatus();
      a.stop = false;
    }
    // Producer thread: touches only `a` (under a.mu), `loader`, and the
    // Producer-safe methods of RunLoop.
    a.thread = std::thread([&, first, global_base] {
      for (int64_t i = first; i <= total; ++i) {
        int64_t min_version = 0;
        {
          absl::MutexLock lock(&a.mu);
          auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu) { return a.stop || a.synced >= i - 1 - k; };
          a.mu.Await(absl::Condition(&ready));
          if (a.stop) return;
          min_version = a.version_after.rbegin()->second;
        }
        std::vector<Prompt> prompts;
        for (const Example* e : loader.NextBatch(rl.prompts_per_step())) prompts.push_back(MakePrompt(*e));
        const absl::Time t0 = absl::Now();
        auto rollouts = GenerateStep(rl, prompts, stage_index, i, global_base + i, min_version);
        absl::MutexLock lock(&a.mu);
        if (!rollouts.ok()) {
          a.error = rollouts.status();
          return;
        }
        AsyncRollout::Generated& g = a.generated[i];
        g.seconds = Seconds(t0);
        g.min_version = min_version;
        for (const auto& group : rollouts->groups) {
          for (const auto& t : group.samples()) {
            g.reward_sum += t.reward();
            g.reward_sq += t.reward() * t.reward();
            g.length_sum += t.response_token_ids_size();
            ++g.count;
          }
        }
        // Only the counts travel on: the groups are in the buffer.
        g.groups = static_cast<int>(rollouts->groups.size());
        g.refill_rounds = rollouts->refill_rounds;
        g.informative = rollouts->informative;
        g.stragglers = rollouts->stragglers;
        a.produced = i;
      }
    });
  };

  auto step = [&]() -> absl::Status {
    ++global_step_;
    RLMESH_RETURN_IF_ERROR(SaveRunnerState());
    SetPhase("wait_rollout");
    const absl::Time t0 = absl::Now();
    const int64_t i = stage_step_ + 1;
    AsyncRollout::Generated gen;
    {
      absl::MutexLock lock(&a.mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(a.mu) { return a.produced >= i || !a.error.ok(); };
      while (!a.mu.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200))) {
        RLMESH_RETURN_IF_ERROR(CheckCancelled());
      }
      if (!a.error.ok()) return a.error;
      gen = a.generated[i];
      a.generated.erase(i);
    }
    const double wait_seconds = Seconds(t0);
    SetPhase("train");
    const absl::Time t1 = absl::Now();
    const bool refill = rl.dynamic_sampling().mode() == "refill";
    RLMESH_ASSIGN_OR_RETURN(const int train_groups, GroupsToTrain(rl, gen.groups, gen.stragglers));
    RLMESH_ASSIGN_OR_RETURN(StepMetrics m, TrainFromBuffer(stage, rl, train_groups));
    nlohmann::json j = StepRecord(stage, m);
    if (refill) RecordRefill(gen.groups, gen.informative, gen.refill_rounds, &j);
    RecordStragglers(gen.stragglers, &j);
    const double mean = gen.count ? gen.reward_sum / gen.count : 0;
    j["rollout_reward_mean"] = mean;
    j["rollout_reward_std"] = gen.count ? std::sqrt(std::max(0.0, gen.reward_sq / gen.count - mean * mean)) : 0;
    j["rollout_response_length"] = gen.count ? gen.length_sum / gen.count : 0;
    // Generation ran alongside the previous steps: its own time, and how
    // long this loop still had to wait for it.
    j["seconds_generate"] = gen.seconds;
    j["seconds_wait_rollout"] = wait_seconds;
    j["seconds_train"] = Seconds(t1);
    // Versions the learner was ahead of the policy that generated the step.
    j["rollout_lag_versions"] = static_cast<double>(versions_.rollout() - 1 - gen.min_version);
    SetMetric("reward_mean", mean);
    RLMESH_RETURN_IF_ERROR(AfterStep(stage, total, &j));
    absl::MutexLock lock(&a.mu);
    a.synced = stage_step_;
    a.version_after[stage_step_] = versions_.rollout();
    return absl::OkStatus();
  };

  // A failed step stops the producer; recovery rewinds, and the next step
  // starts it again from the learners' step.
  absl::Status s = RunSteps(total, [&]() -> absl::Status {
    if (!a.thread.joinable()) start();
    absl::Status st = step();
    if (!st.ok()) a.Stop();
    return st;
  });
  a.Stop();
  return s;
}

}  // namespace rlmesh
