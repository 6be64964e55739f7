// Stage driving: sets the run up, walks the experiment's stages (skipping
// the ones a resumed run finished), and keeps the status snapshot.

#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "coordinator/experiment_config.h"
#include "coordinator/grpc_role_clients.h"
#include "coordinator/progress.h"
#include "coordinator/run_loop.h"

namespace rlmesh {

absl::Status ParallelFor(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { results[i] = fn(i); });
  for (auto& t : threads) t.join();
  for (auto& s : results) RLMESH_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

double Seconds(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

uint64_t MixSeed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (salt + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

RunLoop::RunLoop(RunnerOptions o, const std::atomic<bool>* cancelled, std::unique_ptr<RoleClients> clients)
    : o_(std::move(o)), cancelled_(cancelled), files_(o_.run_dir), clients_(std::move(clients)) {
  status_.set_experiment_id(o_.experiment_id);
  status_.set_state("PENDING");
  status_.set_run_dir(o_.run_dir);
}

absl::Status RunLoop::Run() {
  const absl::Time start = absl::Now();
  absl::Status s = RunStages();
  RemoveSharedMemory();
  {
    absl::MutexLock lock(&mu_);
    summary_.seconds = Seconds(start);
    status_.set_state(s.ok() ? "SUCCEEDED" : s.code() == absl::StatusCode::kCancelled ? "CANCELLED" : "FAILED");
    if (!s.ok()) status_.set_error(std::string(s.message()));
    status_.set_phase("done");
  }
  if (s.ok()) Print(SummaryLine(summary(), o_.run_dir));
  return s;
}

ExperimentStatus RunLoop::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

RunSummary RunLoop::summary() const {
  absl::MutexLock lock(&mu_);
  return summary_;
}

void RunLoop::SetPhase(const std::string& phase) {
  absl::MutexLock lock(&mu_);
  // With tracing on (coordinator run --profile), each phase becomes a span
  // on the coordinator's track when the next one starts.
  if (TracingEnabled()) {
    const int64_t now = absl::ToUnixMicros(absl::Now());
    if (!status_.phase().empty() && phase_start_us_ > 0) {
      RecordSpan(status_.phase(), "coordinator", phase_start_us_, now - phase_start_us_,
                 absl::StrCat("{\"stage\":\"", status_.stage(), "\",\"step\":", status_.step(), "}"));
    }
    phase_start_us_ = now;
  }
  status_.set_phase(phase);
}

void RunLoop::SetMetric(const std::string& key, double value) {
  absl::MutexLock lock(&mu_);
  (*status_.mutable_metrics())[key] = value;
}

void RunLoop::AddMetric(const std::string& key, double delta) {
  absl::MutexLock lock(&mu_);
  (*status_.mutable_metrics())[key] += delta;
}

void RunLoop::AddAccuracy(const std::string& label, double accuracy) {
  absl::MutexLock lock(&mu_);
  summary_.accuracy.push_back({label, accuracy});
}

absl::Status RunLoop::CheckCancelled() const {
  if (cancelled_->load()) return absl::CancelledError("cancelled");
  return absl::OkStatus();
}

void RunLoop::Print(const std::string& line) const {
  if (!o_.progress) return;
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

absl::Status RunLoop::SaveRunnerState() {
  return files_.SaveState({.rollout_round = global_step_, .weights_version = versions_.workers()});
}

int64_t RunLoop::StageSteps(const Stage& s) {
  if (s.has_sft()) return s.sft().steps();
  if (s.has_reward_model()) return s.reward_model().steps();
  if (s.has_dpo()) return s.dpo().steps();
  if (const RlStage* rl = RlSettings(s)) return rl->steps();
  return 0;
}

// Generation ends at the model folder's stop ids; a folder that names none
// would generate to max_new_tokens every time, so the run is refused.
absl::Status RunLoop::CheckStopTokens() {
  const auto& own = cfg().rollout().sampling().stop_token_ids();
  if (!own.empty()) {
    Print(absl::StrCat("model: stop ids [", absl::StrJoin(own, ", "), "] from rollout.sampling.stop_token_ids"));
    return absl::OkStatus();
  }
  const std::vector<int> ids = tokenizer_->stop_ids();
  if (ids.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model.tokenizer ", cfg().model().tokenizer(), ": no stop token: read ", tokenizer_->special_tokens_source(),
        ". Name one as generation_config.json's eos_token_id or tokenizer_config.json's eos_token, or set "
        "rollout.sampling.stop_token_ids"));
  }
  Print(absl::StrCat("model: stop ids [", absl::StrJoin(ids, ", "), "] from ", tokenizer_->special_tokens_source()));
  return absl::OkStatus();
}

absl::Status RunLoop::RunStages() {
  RLMESH_RETURN_IF_ERROR(o_.Validate());
  std::error_code ec;
  std::filesystem::create_directories(o_.run_dir + "/weights", ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", o_.run_dir, ": ", ec.message()));
  RLMESH_RETURN_IF_ERROR(metrics_.Open(o_.run_dir, !cfg().logging().no_jsonl(), cfg().logging().tensorboard()));
  RLMESH_ASSIGN_OR_RETURN(tokenizer_, actor::LoadTokenizer(cfg().model().tokenizer()));
  RLMESH_RETURN_IF_ERROR(CheckStopTokens());
  RLMESH_ASSIGN_OR_RETURN(task_, MakeTask(cfg().task(), cfg().seed(), cfg().model().tokenizer()));
  if (clients_ == nullptr) {
    RLMESH_ASSIGN_OR_RETURN(RoleClients c, ConnectRoles({.replay_buffer = o_.replay_buffer,
                                                         .reward_servers = o_.reward_servers,
                                                         .rollout_workers = o_.rollout_workers,
                                                         .learners = o_.learners,
                                                         .auth_token = o_.auth_token}));
    clients_ = std::make_unique<RoleClients>(std::move(c));
  }
  {
    absl::MutexLock lock(&mu_);
    status_.set_state("RUNNING");
  }
  if (!o_.evaluate_folder.empty()) return EvaluateFolder(o_.evaluate_folder);

  std::string init = cfg().model().init() == "checkpoint" ? cfg().model().path() : "";
  if (o_.resume) {
    // Rollout rounds count across stages and resumes, so trajectory ids
    // (experiment/round/prompt/sample) never repeat in the replay buffer.
    // Versions keep increasing too, so groups left unconsumed by the
    // cancelled run fall below the staleness bound instead of looking new.
    absl::StatusOr<RunnerState> state = files_.LoadState();
    if (state.ok()) {
      global_step_ = state->rollout_round;
      versions_.RestoreWorkers(state->weights_version);
    }
  }
  for (int i = 0; i < cfg().stages_size(); ++i) {
    RLMESH_RETURN_IF_ERROR(CheckCancelled());
    RLMESH_RETURN_IF_ERROR(RunStage(i, &init));
  }
  return absl::OkStatus();
}

// Runs stage `index` from the weights in *init; on success *init is the
// stage's final checkpoint (the next stage's start).
absl::Status RunLoop::RunStage(int i, std::string* init) {
  const Stage& stage = cfg().stages(i);
  if (o_.resume) {
    // A finished stage left a marker: skip it, start the next from its end.
    absl::StatusOr<StageMarker> marker = files_.ReadStageMarker(i);
    if (marker.ok()) {
      if (i == 0 && marker->init_accuracy) AddAccuracy("init", *marker->init_accuracy);
      *init = marker->checkpoint;
      AddAccuracy(StageName(stage), marker->accuracy);
      Print(absl::StrCat("resume: stage ", StageName(stage), " already finished (", *init, ")"));
      return absl::OkStatus();
    }
  }
  {
    absl::MutexLock lock(&mu_);
    status_.set_stage_index(i);
    status_.set_stage(StageName(stage));
    status_.set_step(0);
  }
  stage_index_ = i;
  stage_init_ = *init;
  until_reached_ = false;
  RLMESH_RETURN_IF_ERROR(ConfigureLearners(i, *init));
  // A reward model is not a policy: the rollout workers keep the policy
  // they hold, and the next stage starts from the same policy folder.
  const bool reward_model = stage.has_reward_model();
  // A stage starts from a folder (the workers may not have a model yet, or
  // a different one); steps then sync through the group.
  if (!reward_model) RLMESH_RETURN_IF_ERROR(SyncWeights(/*through_checkpoint=*/true));
  std::optional<double> init_accuracy;
  if (i == 0) {
    absl::StatusOr<double> previous = files_.ReadInitAccuracy();
    if (o_.resume && previous.ok()) {
      init_accuracy = *previous;
    } else {
      std::vector<nlohmann::json> samples;
      RLMESH_ASSIGN_OR_RETURN(init_accuracy, Evaluate("init", 0, /*final=*/true, /*pass_at=*/true, &samples));
      RLMESH_RETURN_IF_ERROR(WriteEvalSamples(absl::StrCat(o_.run_dir, "/eval/init.jsonl"), samples));
      RLMESH_RETURN_IF_ERROR(files_.WriteInitAccuracy(*init_accuracy));
    }
    AddAccuracy("init", *init_accuracy);
  }
  if (RlSettings(stage) == nullptr) {
    RLMESH_RETURN_IF_ERROR(RunSft(stage));  // SFT, reward model, DPO
  } else {
    RLMESH_RETURN_IF_ERROR(RunRl(stage));
  }
  if (reward_model) {
    // No held-out generation eval for a reward model (it does not
    // generate); keep its folder and report it.
    RLMESH_ASSIGN_OR_RETURN(std::string rm_dir, SaveAll());
    metrics_.Record({{"event", "reward_model"}, {"stage", StageName(stage)}, {"path", rm_dir}});
    Print(absl::StrCat(StageName(stage), ": reward model in ", rm_dir));
    return absl::OkStatus();
  }
  RLMESH_ASSIGN_OR_RETURN(*init, SaveAll());
  std::vector<nlohmann::json> samples;
  RLMESH_ASSIGN_OR_RETURN(double acc, Evaluate(StageName(stage), stage_step_, /*final=*/true, /*pass_at=*/true, &samples));
  RLMESH_RETURN_IF_ERROR(WriteEvalSamples(absl::StrCat(o_.run_dir, "/eval/", i, "-", StageName(stage), ".jsonl"), samples));
  RLMESH_RETURN_IF_ERROR(
      files_.WriteStageMarker(i, {.checkpoint = *init, .accuracy = acc, .init_accuracy = init_accuracy}));
  AddAccuracy(StageName(stage), acc);
  return absl::OkStatus();
}

}  // namespace rlmesh
