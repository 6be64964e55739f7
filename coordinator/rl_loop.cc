// SFT-like stages (one TrainStep on the learner's own data per step),
// synchronous RL (generate -> train -> weights -> eval, in that order, every
// step), and the tail every step shares: weight sync, periodic eval and
// checkpoint, buffer trimming, the metrics record and the progress line.

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "coordinator/experiment_config.h"
#include "coordinator/progress.h"
#include "coordinator/run_loop.h"

namespace rlmesh {
namespace {

bool ShouldEval(const ExperimentConfig& cfg, int64_t step, int64_t total) {
  const int every = cfg.eval().every();
  return every > 0 && step % every == 0 && step != total;
}

// Whether an SFT stage's stop rule checks after `step`.
bool UntilDue(const SftUntil& u, int64_t step, int64_t total) {
  const int every = u.every() > 0 ? u.every() : 5;
  return u.eval_accuracy() > 0 && step >= u.after() && step % every == 0 && step != total;
}

bool ShouldCheckpoint(const ExperimentConfig& cfg, int64_t step, int64_t total) {
  const int every = cfg.checkpoint().every();
  return every > 0 && step % every == 0 && step != total;
}

}  // namespace

absl::Status RunLoop::RunSft(const Stage& stage) {
  const int64_t total = StageSteps(stage);
  return RunSteps(total, [&]() -> absl::Status {
    SetPhase("train");
    const absl::Time t0 = absl::Now();
    RLMESH_ASSIGN_OR_RETURN(StepMetrics m, TrainStep([](TrainStepRequest* r) { r->set_from_task(true); }));
    nlohmann::json j = StepRecord(stage, m);
    j["seconds_train"] = Seconds(t0);
    return AfterStep(stage, total, &j);
  });
}

absl::Status RunLoop::RunRl(const Stage& stage) {
  const RlStage& rl = *RlSettings(stage);
  if (rl.max_staleness() > 0) return RunRlAsync(stage);
  const int64_t total = rl.steps();
  const int stage_index = stage_index_;
  // The loader resumes where a resumed learner is: one batch per step.
  PromptLoader loader(&task_->train(), cfg().seed() * 7919 + stage_index);
  auto rewind = [&] {
    loader = PromptLoader(&task_->train(), cfg().seed() * 7919 + stage_index);
    for (int64_t done = 0; done < stage_step_; ++done) loader.NextBatch(rl.prompts_per_step());
  };
  rewind();
  return RunSteps(total, [&]() -> absl::Status {
    ++global_step_;
    RLMESH_RETURN_IF_ERROR(SaveRunnerState());
    SetPhase("generate");
    const absl::Time t0 = absl::Now();
    std::vector<Prompt> prompts;
    for (const Example* e : loader.NextBatch(rl.prompts_per_step())) prompts.push_back(MakePrompt(*e));
    RLMESH_ASSIGN_OR_RETURN(StepRollouts rollouts, GenerateStep(rl, prompts, stage_index, stage_step_ + 1,
                                                                global_step_, versions_.rollout()));
    const std::vector<TrajectoryGroup>& groups = rollouts.groups;
    const double gen_seconds = Seconds(t0);
    double sum = 0, sq = 0, len = 0;
    int count = 0;
    for (const auto& g : groups) {
      for (const auto& t : g.samples()) {
        sum += t.reward();
        sq += t.reward() * t.reward();
        len += t.response_token_ids_size();
        ++count;
      }
    }
    nlohmann::json sleep = nlohmann::json::object();
    RLMESH_RETURN_IF_ERROR(SleepRollouts(&sleep));
    SetPhase("train");
    const absl::Time t1 = absl::Now();
    const bool refill = rl.dynamic_sampling().mode() == "refill";
    RLMESH_ASSIGN_OR_RETURN(const int train_groups,
                            GroupsToTrain(rl, static_cast<int>(groups.size()), rollouts.stragglers));
    RLMESH_ASSIGN_OR_RETURN(StepMetrics m, TrainFromBuffer(stage, rl, train_groups));
    nlohmann::json j = StepRecord(stage, m);
    j.update(sleep);
    if (refill) RecordRefill(static_cast<int>(groups.size()), rollouts.informative, rollouts.refill_rounds, &j);
    RecordStragglers(rollouts.stragglers, &j);
    const double mean = count ? sum / count : 0;
    j["rollout_reward_mean"] = mean;
    j["rollout_reward_std"] = count ? std::sqrt(std::max(0.0, sq / count - mean * mean)) : 0;
    j["rollout_response_length"] = count ? len / count : 0;
    j["seconds_generate"] = gen_seconds;
    j["seconds_train"] = Seconds(t1);
    SetMetric("reward_mean", mean);
    return AfterStep(stage, total, &j);
  }, rewind);
}

void RunLoop::RecordRefill(int generated, int informative, int refill_rounds, nlohmann::json* j) {
  (*j)["dynamic_sampling_groups_generated"] = static_cast<double>(generated);
  (*j)["dynamic_sampling_groups_informative"] = static_cast<double>(informative);
  (*j)["dynamic_sampling_refill_rounds"] = static_cast<double>(refill_rounds);
}

void RunLoop::RecordStragglers(const StragglerCounts& c, nlohmann::json* j) {
  if (cfg().rollout().request_timeout_ms() > 0) {
    (*j)["rollout_timeouts"] = static_cast<double>(c.timed_out_requests);
    (*j)["rollout_redispatched_prompts"] = static_cast<double>(c.redispatched_prompts);
    (*j)["rollout_dropped_prompts"] = static_cast<double>(c.dropped_prompts);
    AddMetric("rollout_timeouts", c.timed_out_requests);
    AddMetric("rollout_redispatched_prompts", c.redispatched_prompts);
    AddMetric("rollout_dropped_prompts", c.dropped_prompts);
  }
  if (cfg().reward().call().on_failure() == "drop_group") {
    (*j)["reward_dropped_groups"] = static_cast<double>(c.dropped_groups);
    AddMetric("reward_dropped_groups", c.dropped_groups);
  }
}

absl::Status RunLoop::RecordGraphs(nlohmann::json* j) {
  if (!cfg().rollout().cuda_graphs()) return absl::OkStatus();
  int64_t captures = 0, replays = 0;
  for (size_t i = 0; i < clients_->rollouts.size(); ++i) {
    absl::StatusOr<RolloutStatus> st = clients_->rollouts[i]->GetStatus();
    if (!st.ok()) return absl::Status(st.status().code(), absl::StrCat("rollout ", i, " GetStatus: ", st.status().message()));
    captures += st->cuda_graph_captures();
    replays += st->cuda_graph_replays();
  }
  // The workers count since they started: the step's share is the change.
  (*j)["cuda_graph_captures"] = static_cast<double>(captures - graph_totals_.first);
  (*j)["cuda_graph_replays"] = static_cast<double>(replays - graph_totals_.second);
  graph_totals_ = {captures, replays};
  return absl::OkStatus();
}

absl::StatusOr<int> RunLoop::GroupsToTrain(const RlStage& rl, int groups, const StragglerCounts& c) const {
  const bool refill = rl.dynamic_sampling().mode() == "refill";
  if (!refill && c.missing() == 0) return 0;
  // The learner must not wait for groups that will never be stored.
  if (groups == 0) {
    return absl::UnavailableError(absl::StrCat("step ", stage_step_ + 1, ": no group to train on (",
                                               c.dropped_prompts, " prompts dropped at the rollout deadline, ",
                                               c.dropped_groups, " groups dropped by reward.call.on_failure)"));
  }
  return groups;
}

nlohmann::json RunLoop::StepRecord(const Stage& stage, const StepMetrics& m) {
  nlohmann::json j = {{"event", "step"}, {"stage", StageName(stage)}, {"step", stage_step_},
                      {"policy_version", versions_.learner()}, {"time", absl::ToUnixMicros(absl::Now()) / 1e6}};
  absl::MutexLock lock(&mu_);
  for (const auto& [k, v] : m.values()) {
    j[k] = v;
    (*status_.mutable_metrics())[k] = v;
  }
  status_.set_step(stage_step_);
  status_.set_total_steps(StageSteps(stage));
  status_.set_policy_version(versions_.learner());
  return j;
}

absl::Status RunLoop::AfterStep(const Stage& stage, int64_t total, nlohmann::json* j) {
  const bool reward_model = stage.has_reward_model();
  if (!reward_model) {
    RLMESH_RETURN_IF_ERROR(SyncWeights());
    (*j)["seconds_sync"] = last_sync_seconds_;
    if (last_sync_bytes_ >= 0) (*j)["weight_sync_bytes"] = last_sync_bytes_;
    // How the weights travelled: the configured backend, or checkpoint
    // folders (weight_sync.fallback).
    (*j)["weight_sync"] = WeightSyncName();
    RLMESH_RETURN_IF_ERROR(RecordGraphs(j));
  }
  if (!reward_model && ShouldEval(cfg(), stage_step_, total)) {
    const absl::Time t = absl::Now();
    RLMESH_ASSIGN_OR_RETURN(double acc, Evaluate(StageName(stage), stage_step_, false));
    (*j)["accuracy"] = acc;
    (*j)["seconds_eval"] = Seconds(t);
  }
  if (stage.has_sft() && UntilDue(stage.sft().until(), stage_step_, total)) {
    // The stop rule of an SFT stage: reuse the periodic eval if there was one.
    if (!j->contains("accuracy")) {
      const absl::Time t = absl::Now();
      RLMESH_ASSIGN_OR_RETURN(double acc, Evaluate(StageName(stage), stage_step_, false, /*pass_at=*/false));
      (*j)["accuracy"] = acc;
      (*j)["seconds_eval"] = Seconds(t);
    }
    if ((*j)["accuracy"].get<double>() >= stage.sft().until().eval_accuracy()) {
      until_reached_ = true;
      (*j)["until_reached"] = true;
      Print(absl::StrFormat("%s: held-out accuracy %.1f%% >= %.1f%% at step %lld: stage done (until.eval_accuracy)",
                            StageName(stage), 100 * (*j)["accuracy"].get<double>(),
                            100 * stage.sft().until().eval_accuracy(), static_cast<long long>(stage_step_)));
    }
  }
  if (RlSettings(stage) != nullptr) RLMESH_RETURN_IF_ERROR(TrimBuffer());
  if (ShouldCheckpoint(cfg(), stage_step_, total)) RLMESH_RETURN_IF_ERROR(SaveAll().status());
  metrics_.NextStep();
  metrics_.Record(*j);
  if (!cfg().logging().quiet()) {
    if (auto line = ProgressLine(stage, stage_step_, total, *j)) Print(*line);
  }
  return absl::OkStatus();
}

// buffer.keep_steps / buffer.max_bytes: trims the experiment's oldest
// rollout steps after each RL step.
absl::Status RunLoop::TrimBuffer() {
  const BufferConfig& b = cfg().buffer();
  if (b.keep_steps() <= 0 && b.max_bytes() <= 0) return absl::OkStatus();
  TrimRequest req;
  req.set_experiment_id(o_.experiment_id);
  req.set_keep_steps(b.keep_steps());
  req.set_max_bytes(b.max_bytes());
  absl::StatusOr<TrimResponse> resp = clients_->replay_buffer->Trim(req);
  if (!resp.ok()) {
    return absl::Status(resp.status().code(), absl::StrCat("replay buffer Trim: ", resp.status().message()));
  }
  AddMetric("buffer_trimmed_groups", static_cast<double>(resp->groups_removed()));
  return absl::OkStatus();
}

}  // namespace rlmesh
