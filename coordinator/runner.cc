#include "coordinator/runner.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "actor/tokenizer.h"
#include "common/atomic_file.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/tensorboard.h"
#include "coordinator/experiment_config.h"
#include "nlohmann/json.hpp"
#include "proto/learner.grpc.pb.h"
#include "proto/replay_buffer.grpc.pb.h"
#include "proto/reward.grpc.pb.h"
#include "proto/rollout.grpc.pb.h"
#include "weight_sync/segments.h"
#include "tasks/encoding.h"
#include "tasks/task.h"

namespace rlmesh {

absl::Status RunnerOptions::Validate() const {
  if (experiment_id.empty()) return absl::InvalidArgumentError("experiment_id: empty");
  if (run_dir.empty()) return absl::InvalidArgumentError("run_dir: empty");
  if (replay_buffer.empty()) return absl::InvalidArgumentError("replay_buffer: no address");
  if (reward_servers.empty()) return absl::InvalidArgumentError("reward_servers: none");
  if (rollout_workers.empty()) return absl::InvalidArgumentError("rollout_workers: none");
  if (learners.empty()) return absl::InvalidArgumentError("learners: none");
  if (static_cast<int>(learners.size()) != experiment.learner().shards()) {
    return absl::InvalidArgumentError(absl::StrCat("learner.shards: the experiment wants ", experiment.learner().shards(),
                                                   " but the cluster has ", learners.size(), " learners"));
  }
  return absl::OkStatus();
}

namespace {

// Runs fn(i) for i in [0, n) on n threads; returns the first error.
absl::Status ParallelFor(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { results[i] = fn(i); });
  for (auto& t : threads) t.join();
  for (auto& s : results) RLMESH_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

double Seconds(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// splitmix64 over (seed, salt): independent seeds from one experiment seed.
uint64_t MixSeed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (salt + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string Bar(double frac, int width = 20) {
  const int full = static_cast<int>(std::round(std::max(0.0, std::min(1.0, frac)) * width));
  std::string s;
  for (int i = 0; i < width; ++i) s += i < full ? "\u2588" : "\u2591";
  return s;
}

}  // namespace

class ExperimentRunner::Impl {
 public:
  Impl(RunnerOptions o, std::atomic<bool>* cancelled) : o_(std::move(o)), cancelled_(cancelled) {
    status_.set_experiment_id(o_.experiment_id);
    status_.set_state("PENDING");
    status_.set_run_dir(o_.run_dir);
  }

  absl::Status Run() {
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
    if (s.ok() && o_.progress) PrintSummary();
    return s;
  }

  ExperimentStatus status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  // Weight-sync segments of this run (every sync generation) outlive a
  // killed publisher; the run removes them when it ends.
  void RemoveSharedMemory() { weight_sync::RemoveSegments(ShmPrefixBase()); }
  // Every sync generation's spec.shm_prefix starts with this.
  std::string ShmPrefixBase() const { return absl::StrCat("rlmesh-", ::getpid(), "-", o_.experiment_id); }
  RunSummary summary() const {
    absl::MutexLock lock(&mu_);
    return summary_;
  }

 private:
  const ExperimentConfig& cfg() const { return o_.experiment; }

  void SetPhase(const std::string& phase) {
    absl::MutexLock lock(&mu_);
    status_.set_phase(phase);
  }

  absl::Status CheckCancelled() const {
    if (cancelled_->load()) return absl::CancelledError("cancelled");
    return absl::OkStatus();
  }

  absl::Status Connect() {
    ClientOptions co;
    co.auth_token = o_.auth_token;
    co.default_timeout = absl::Minutes(30);
    auto make = [&](const std::string& addr) -> absl::StatusOr<RpcClient> { return RpcClient::Create(addr, co); };
    RLMESH_ASSIGN_OR_RETURN(RpcClient rb, make(o_.replay_buffer));
    replay_ = std::make_unique<RpcClient>(std::move(rb));
    for (const auto& a : o_.reward_servers) {
      RLMESH_ASSIGN_OR_RETURN(RpcClient c, make(a));
      rewards_.push_back(std::make_unique<RpcClient>(std::move(c)));
    }
    for (const auto& a : o_.rollout_workers) {
      RLMESH_ASSIGN_OR_RETURN(RpcClient c, make(a));
      rollouts_.push_back(std::make_unique<RpcClient>(std::move(c)));
    }
    for (const auto& a : o_.learners) {
      RLMESH_ASSIGN_OR_RETURN(RpcClient c, make(a));
      learners_.push_back(std::make_unique<RpcClient>(std::move(c)));
    }
    return absl::OkStatus();
  }

  absl::Status RunStages() {
    RLMESH_RETURN_IF_ERROR(o_.Validate());
    std::error_code ec;
    std::filesystem::create_directories(o_.run_dir + "/weights", ec);
    if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", o_.run_dir, ": ", ec.message()));
    if (!cfg().logging().no_jsonl()) {
      metrics_.open(o_.run_dir + "/metrics.jsonl", std::ios::app);
      if (!metrics_) return absl::PermissionDeniedError(absl::StrCat("cannot write ", o_.run_dir, "/metrics.jsonl"));
    }
    if (cfg().logging().tensorboard()) {
      RLMESH_ASSIGN_OR_RETURN(tensorboard_, TensorBoardWriter::Create(o_.run_dir + "/tensorboard"));
    }
    RLMESH_ASSIGN_OR_RETURN(tokenizer_, actor::LoadTokenizer(cfg().model().tokenizer()));
    RLMESH_ASSIGN_OR_RETURN(task_, MakeTask(cfg().task(), cfg().seed(), cfg().model().tokenizer()));
    RLMESH_RETURN_IF_ERROR(Connect());
    {
      absl::MutexLock lock(&mu_);
      status_.set_state("RUNNING");
    }

    std::string init = cfg().model().init() == "checkpoint" ? cfg().model().path() : "";
    LoadRunnerState();
    for (int i = 0; i < cfg().stages_size(); ++i) {
      RLMESH_RETURN_IF_ERROR(CheckCancelled());
      const Stage& stage = cfg().stages(i);
      if (o_.resume) {
        // A finished stage left a marker: skip it, start the next from its end.
        auto marker = ReadJsonFile(StageMarker(i));
        if (marker.ok()) {
          if (i == 0 && marker->contains("init_accuracy")) {
            absl::MutexLock lock(&mu_);
            summary_.accuracy.push_back({"init", (*marker)["init_accuracy"].get<double>()});
          }
          init = (*marker)["checkpoint"].get<std::string>();
          absl::MutexLock lock(&mu_);
          summary_.accuracy.push_back({StageName(stage), (*marker)["accuracy"].get<double>()});
          if (o_.progress) std::printf("resume: stage %s already finished (%s)\n", StageName(stage).c_str(), init.c_str());
          continue;
        }
      }
      {
        absl::MutexLock lock(&mu_);
        status_.set_stage_index(i);
        status_.set_stage(StageName(stage));
        status_.set_step(0);
      }
      stage_init_ = init;
      until_reached_ = false;
      RLMESH_RETURN_IF_ERROR(ConfigureLearners(i, init));
      // A reward model is not a policy: the rollout workers keep the policy
      // they hold, and the next stage starts from the same policy folder.
      const bool reward_model = stage.has_reward_model();
      // A stage starts from a folder (the workers may not have a model yet,
      // or a different one); steps then sync through the group.
      if (!reward_model) RLMESH_RETURN_IF_ERROR(SyncWeights(/*through_checkpoint=*/true));
      double init_accuracy = -1;
      if (i == 0) {
        auto previous = ReadJsonFile(o_.run_dir + "/init_accuracy.json");
        if (o_.resume && previous.ok()) {
          init_accuracy = (*previous)["accuracy"].get<double>();
        } else {
          RLMESH_ASSIGN_OR_RETURN(init_accuracy, Evaluate("init", 0, /*final=*/true));
          RLMESH_RETURN_IF_ERROR(WriteJsonFile(o_.run_dir + "/init_accuracy.json", {{"accuracy", init_accuracy}}));
        }
        absl::MutexLock lock(&mu_);
        summary_.accuracy.push_back({"init", init_accuracy});
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
        const nlohmann::json rec = {{"event", "reward_model"}, {"stage", StageName(stage)}, {"path", rm_dir}};
        Record(rec);
        if (o_.progress) {
          std::printf("%s: reward model in %s\n", StageName(stage).c_str(), rm_dir.c_str());
          std::fflush(stdout);
        }
        continue;
      }
      RLMESH_ASSIGN_OR_RETURN(init, SaveAll());
      RLMESH_ASSIGN_OR_RETURN(double acc, Evaluate(StageName(stage), stage_step_, /*final=*/true));
      nlohmann::json marker = {{"checkpoint", init}, {"accuracy", acc}};
      if (init_accuracy >= 0) marker["init_accuracy"] = init_accuracy;
      RLMESH_RETURN_IF_ERROR(WriteJsonFile(StageMarker(i), marker));
      absl::MutexLock lock(&mu_);
      summary_.accuracy.push_back({StageName(stage), acc});
    }
    return absl::OkStatus();
  }

  std::string StageMarker(int i) const { return absl::StrCat(o_.run_dir, "/stage-", i, ".done.json"); }

  static absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(path);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::DataLossError(absl::StrCat(path, ": not JSON"));
    return j;
  }

  static absl::Status WriteJsonFile(const std::string& path, const nlohmann::json& j) {
    return WriteFileAtomically(path, j.dump() + "\n");
  }

  // Rollout rounds count across stages and resumes, so trajectory ids
  // (experiment/round/prompt/sample) never repeat in the replay buffer.
  void LoadRunnerState() {
    auto state = ReadJsonFile(o_.run_dir + "/runner_state.json");
    if (!o_.resume || !state.ok()) return;
    global_step_ = state->value("rollout_round", int64_t{0});
    // Versions keep increasing too, so groups left unconsumed by the
    // cancelled run fall below the staleness bound instead of looking new.
    weights_version_ = state->value("weights_version", int64_t{0});
  }

  absl::Status SaveRunnerState() {
    return WriteJsonFile(o_.run_dir + "/runner_state.json",
                         {{"rollout_round", global_step_}, {"weights_version", weights_version_}});
  }

  static int64_t StageSteps(const Stage& s) {
    if (s.has_sft()) return s.sft().steps();
    if (s.has_reward_model()) return s.reward_model().steps();
    if (s.has_dpo()) return s.dpo().steps();
    if (const RlStage* rl = RlSettings(s)) return rl->steps();
    return 0;
  }

  // --- learners ---------------------------------------------------------

  absl::Status ConfigureLearners(int stage_index, const std::string& init) {
    SetPhase("configure");
    const int k = static_cast<int>(learners_.size());
    const std::string stage_name = StageName(cfg().stages(stage_index));
    const std::string store = k > 1 ? absl::StrCat("file:", o_.run_dir, "/store/", stage_index, "-", stage_name) : "";
    if (k > 1) {
      std::error_code ec;
      std::filesystem::create_directories(o_.run_dir + "/store", ec);
      std::filesystem::remove(o_.run_dir + "/store/" + std::to_string(stage_index) + "-" + stage_name, ec);
    }
    std::vector<ConfigureResponse> responses(k);
    RLMESH_RETURN_IF_ERROR(ParallelFor(k, [&](int r) -> absl::Status {
      ConfigureRequest req;
      *req.mutable_experiment() = cfg();
      req.set_stage_index(stage_index);
      req.set_init_checkpoint(init);
      req.set_rank(r);
      req.set_world_size(k);
      req.set_store_address(store);
      req.set_checkpoint_dir(absl::StrCat(o_.run_dir, "/checkpoints/", stage_index, "-", stage_name));
      req.set_replay_buffer_address(o_.replay_buffer);
      auto stub = Learner::NewStub(learners_[r]->channel());
      auto ctx = learners_[r]->NewContext(absl::Minutes(10));
      absl::Status s = FromGrpcStatus(stub->Configure(ctx.get(), req, &responses[r]));
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("learner ", r, " Configure: ", s.message()));
      return absl::OkStatus();
    }));
    version_ = responses[0].policy_version();
    stage_step_ = responses[0].step();
    // Rollout workers only accept increasing versions, and a new stage's
    // learner counts from its own start: shift its numbering so the
    // workers' versions keep increasing across stages.
    version_offset_ = (weights_version_ + 1) - version_;
    return absl::OkStatus();
  }

  // Saves on every shard (rank 0 writes the model); returns rank 0's folder.
  absl::StatusOr<std::string> SaveAll(const std::string& path = "") {
    SetPhase("checkpoint");
    std::vector<SaveResponse> responses(learners_.size());
    RLMESH_RETURN_IF_ERROR(ParallelFor(static_cast<int>(learners_.size()), [&](int r) -> absl::Status {
      SaveRequest req;
      req.set_path(path);
      auto stub = Learner::NewStub(learners_[r]->channel());
      auto ctx = learners_[r]->NewContext(absl::Minutes(10));
      absl::Status s = FromGrpcStatus(stub->Save(ctx.get(), req, &responses[r]));
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("learner ", r, " Save: ", s.message()));
      return absl::OkStatus();
    }));
    return responses[0].path();
  }

  absl::StatusOr<StepMetrics> TrainStep(const std::function<void(TrainStepRequest*)>& fill) {
    std::vector<TrainStepResponse> responses(learners_.size());
    RLMESH_RETURN_IF_ERROR(ParallelFor(static_cast<int>(learners_.size()), [&](int r) -> absl::Status {
      TrainStepRequest req;
      req.set_step(stage_step_);  // 0-based: the number of steps already taken
      fill(&req);
      auto stub = Learner::NewStub(learners_[r]->channel());
      auto ctx = learners_[r]->NewContext(absl::Minutes(30));
      absl::Status s = FromGrpcStatus(stub->TrainStep(ctx.get(), req, &responses[r]));
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("learner ", r, " TrainStep: ", s.message()));
      return absl::OkStatus();
    }));
    ++stage_step_;
    version_ = responses[0].policy_version();
    return responses[0].metrics();
  }

  // --- weights ----------------------------------------------------------

  // Puts the learner's current weights into every rollout worker. Uses the
  // weight-sync group when both sides support it, else a checkpoint folder.
  absl::Status SyncWeights(bool through_checkpoint = false) {
    SetPhase("sync");
    const absl::Time start = absl::Now();
    if (!sync_unavailable_ && !through_checkpoint) {
      absl::Status s = SyncThroughGroup();
      if (s.ok()) {
        last_sync_seconds_ = Seconds(start);
        group_sync_worked_ = true;
        return s;
      }
      // A backend this build or host cannot run (UNIMPLEMENTED; NCCL or
      // CUDA_IPC without a GPU or library: FAILED_PRECONDITION on the first
      // try) falls back to checkpoint folders; later failures are errors.
      const bool unavailable = s.code() == absl::StatusCode::kUnimplemented ||
                               (s.code() == absl::StatusCode::kFailedPrecondition && !group_sync_worked_);
      if (!unavailable) return s;
      RLMESH_LOG(WARNING) << "weight-sync group unavailable (" << s.message() << "); syncing through checkpoint folders";
      sync_unavailable_ = true;
    }
    const std::string dir = absl::StrCat(o_.run_dir, "/weights/v", version_);
    RLMESH_ASSIGN_OR_RETURN(std::string saved, SaveAll(dir));
    RLMESH_RETURN_IF_ERROR(LoadIntoRollouts([&](LoadWeightsRequest* req) { req->set_checkpoint_path(saved); }));
    // Only the newest folder is needed.
    std::error_code ec;
    if (!last_weights_dir_.empty() && last_weights_dir_ != saved) std::filesystem::remove_all(last_weights_dir_, ec);
    last_weights_dir_ = saved;
    last_sync_seconds_ = Seconds(start);
    return absl::OkStatus();
  }

  absl::Status SyncThroughGroup() {
    const int n = static_cast<int>(rollouts_.size());
    WeightSyncSpec spec;
    spec.set_backend(cfg().weight_sync().backend());
    spec.set_world_size(n + 1);
    spec.set_group_name(absl::StrCat(o_.experiment_id, "-g", sync_generation_));
    spec.set_timeout_ms(cfg().weight_sync().timeout_ms() > 0 ? cfg().weight_sync().timeout_ms() : 60000);
    spec.set_bucket_mb(cfg().weight_sync().bucket_mb());
    spec.set_shm_prefix(absl::StrCat(ShmPrefixBase(), "-g", sync_generation_));
    if (spec.backend() == WEIGHT_SYNC_GLOO || spec.backend() == WEIGHT_SYNC_NCCL) {
      // The learner's rank 0 hosts the group's c10d TCPStore; a rebuilt
      // group (after a failure) reuses it under a new group name, and a
      // restarted learner hosts a new one (Recover forgets the port).
      if (sync_store_port_ == 0) {
        HostWeightSyncStoreRequest req;
        req.set_world_size(n + 1);
        req.set_timeout_ms(spec.timeout_ms());
        HostWeightSyncStoreResponse resp;
        auto stub = Learner::NewStub(learners_[0]->channel());
        auto ctx = learners_[0]->NewContext(absl::Seconds(30));
        absl::Status s = FromGrpcStatus(stub->HostWeightSyncStore(ctx.get(), req, &resp));
        if (!s.ok()) return absl::Status(s.code(), absl::StrCat("learner 0 HostWeightSyncStore: ", s.message()));
        sync_store_port_ = resp.port();
        RLMESH_LOG(INFO) << "weight-sync store on " << o_.sync_store_host << ":" << sync_store_port_;
      }
      spec.set_store_host(o_.sync_store_host);
      spec.set_store_port(sync_store_port_);
    }
    if (!sync_configured_) {
      RLMESH_RETURN_IF_ERROR(ParallelFor(n, [&](int i) -> absl::Status {
        ConfigureWeightSyncRequest req;
        *req.mutable_spec() = spec;
        req.mutable_spec()->set_rank(i + 1);
        ConfigureWeightSyncResponse resp;
        auto stub = RolloutService::NewStub(rollouts_[i]->channel());
        auto ctx = rollouts_[i]->NewContext(absl::Minutes(1));
        return FromGrpcStatus(stub->ConfigureWeightSync(ctx.get(), req, &resp));
      }));
      sync_configured_ = true;
    }
    PublishWeightsRequest pub;
    *pub.mutable_spec() = spec;
    pub.mutable_spec()->set_rank(0);
    PublishWeightsResponse published;
    // Publisher and receivers run at the same time: for Gloo it is one
    // collective. The data carries its layout, so receivers need only the
    // learner's version.
    absl::Status publish_status;
    std::thread publisher([&] {
      auto stub = Learner::NewStub(learners_[0]->channel());
      auto ctx = learners_[0]->NewContext(absl::Milliseconds(spec.timeout_ms() + 5000));
      publish_status = FromGrpcStatus(stub->PublishWeights(ctx.get(), pub, &published));
    });
    absl::Status load_status =
        LoadIntoRollouts([&](LoadWeightsRequest* req) { req->mutable_sync()->set_version(version_); });
    publisher.join();
    RLMESH_RETURN_IF_ERROR(publish_status);
    return load_status;
  }

  // The learner's version in the rollout workers' (monotonic) numbering.
  int64_t RolloutVersion() const { return version_ + version_offset_; }

  absl::Status LoadIntoRollouts(const std::function<void(LoadWeightsRequest*)>& fill) {
    weights_version_ = RolloutVersion();
    RLMESH_RETURN_IF_ERROR(SaveRunnerState());
    return ParallelFor(static_cast<int>(rollouts_.size()), [&](int i) -> absl::Status {
      LoadWeightsRequest req;
      fill(&req);
      req.set_version(RolloutVersion());
      LoadWeightsResponse resp;
      auto stub = RolloutService::NewStub(rollouts_[i]->channel());
      auto ctx = rollouts_[i]->NewContext(absl::Minutes(5));
      absl::Status s = FromGrpcStatus(stub->LoadWeights(ctx.get(), req, &resp));
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("rollout ", i, " LoadWeights: ", s.message()));
      return absl::OkStatus();
    });
  }

  // --- generation -------------------------------------------------------

  Prompt MakePrompt(const Example& e) const {
    Prompt p;
    p.set_prompt_id(e.id);
    for (int id : EncodePrompt(*tokenizer_, e.prompt)) p.add_token_ids(id);
    p.set_reference_answer(e.answer);
    return p;
  }

  // Seed of the rollouts of stage step `step` (1-based): keyed by the stage
  // and the step, not by the rollout round, so a resumed run that redoes a
  // step samples exactly what the uninterrupted run sampled.
  uint64_t RolloutSeed(int stage_index, int64_t step) const {
    return MixSeed(MixSeed(cfg().seed(), 0x5a3d + static_cast<uint64_t>(stage_index)), static_cast<uint64_t>(step));
  }

  SamplingParams Sampling(bool greedy, uint64_t seed) const {
    SamplingParams s = cfg().rollout().sampling();
    s.set_greedy(greedy);
    s.set_seed(seed);
    if (s.stop_token_ids().empty() && tokenizer_->eos_id() >= 0) s.add_stop_token_ids(tokenizer_->eos_id());
    return s;
  }

  // Splits prompts over the workers and streams the groups back. A worker
  // refuses the request while it holds weights older than `min_version`
  // (-1: the learner's current version).
  absl::StatusOr<std::vector<TrajectoryGroup>> Generate(const std::vector<Prompt>& prompts, int n,
                                                        const SamplingParams& sampling, bool pipeline, int64_t step,
                                                        int64_t min_version = -1) {
    const int workers = static_cast<int>(rollouts_.size());
    std::vector<std::vector<TrajectoryGroup>> out(workers);
    RLMESH_RETURN_IF_ERROR(ParallelFor(workers, [&](int w) -> absl::Status {
      GenerateRequest req;
      req.set_experiment_id(o_.experiment_id);
      req.set_step(step);
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
      req.set_min_policy_version(min_version >= 0 ? min_version : RolloutVersion());
      req.set_decode_text(true);
      for (const auto& v : cfg().reward().verifiers()) *req.add_verifiers() = v;
      req.set_verifier_timeout_ms(cfg().reward().verifier_timeout_ms());
      auto stub = RolloutService::NewStub(rollouts_[w]->channel());
      auto ctx = rollouts_[w]->NewContext(absl::Minutes(30));
      auto reader = stub->Generate(ctx.get(), req);
      GenerateResponse resp;
      while (reader->Read(&resp)) {
        if (pipeline && !resp.stored()) {
          ctx->TryCancel();
          reader->Finish().ok();
          return absl::DataLossError(absl::StrCat("rollout ", w, ": group ", resp.group().group_id(), " not stored"));
        }
        out[w].push_back(std::move(*resp.mutable_group()));
      }
      absl::Status s = FromGrpcStatus(reader->Finish());
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat("rollout ", w, " Generate: ", s.message()));
      if (static_cast<int>(out[w].size()) != req.prompts_size()) {
        return absl::DataLossError(absl::StrCat("rollout ", w, ": ", out[w].size(), " groups for ", req.prompts_size(),
                                                " prompts"));
      }
      return absl::OkStatus();
    }));
    std::vector<TrajectoryGroup> all;
    for (auto& v : out) {
      for (auto& g : v) all.push_back(std::move(g));
    }
    return all;
  }

  // Held-out accuracy: greedy, one sample, scored by the first verifier;
  // with `pass_at`, also the sampled pass@k of eval.pass_at.
  absl::StatusOr<double> Evaluate(const std::string& label, int64_t step, bool final, bool pass_at = true) {
    SetPhase("eval");
    const absl::Time start = absl::Now();
    const auto& eval = task_->eval();
    const int count = cfg().eval().prompts() > 0 ? std::min<int>(cfg().eval().prompts(), eval.size()) : eval.size();
    std::vector<Prompt> prompts;
    std::map<std::string, const Example*> by_id;
    for (int i = 0; i < count; ++i) {
      prompts.push_back(MakePrompt(eval[i]));
      by_id[eval[i].id] = &eval[i];
    }
    const std::string& first = cfg().reward().verifiers(0).label().empty() ? cfg().reward().verifiers(0).name()
                                                                            : cfg().reward().verifiers(0).label();
    // Whether each scored item is right by the first verifier, in order.
    auto right = [&](const ScoreResponse& scores) {
      std::vector<bool> out;
      for (const auto& r : scores.results()) {
        auto it = r.components().find(first);
        out.push_back(it != r.components().end() && it->second >= 1.0 - 1e-9);
      }
      return out;
    };
    RLMESH_ASSIGN_OR_RETURN(auto groups, Generate(prompts, 1, Sampling(true, cfg().seed()), false, step));
    RLMESH_ASSIGN_OR_RETURN(auto scores, Score(groups));
    double correct = 0;
    for (bool r : right(scores)) correct += r ? 1 : 0;
    const double acc = groups.empty() ? 0 : correct / groups.size();
    nlohmann::json j = {{"event", "eval"}, {"stage", label}, {"step", step}, {"policy_version", version_},
                        {"accuracy", acc}, {"prompts", groups.size()},
                        {"time", absl::ToUnixMicros(absl::Now()) / 1e6}};
    // pass@k: n = the largest k samples per prompt at the rollout
    // temperature; per prompt with c right, the unbiased estimator
    // 1 - C(n-c, k) / C(n, k), averaged over prompts.
    int n = 0;
    for (int k : cfg().eval().pass_at()) n = std::max(n, k);
    std::string pass_line;
    if (pass_at && n > 0 && !prompts.empty()) {
      RLMESH_ASSIGN_OR_RETURN(auto sampled,
                              Generate(prompts, n, Sampling(false, cfg().seed() * 7919ULL + step), false, step));
      RLMESH_ASSIGN_OR_RETURN(auto sampled_scores, Score(sampled));
      const std::vector<bool> ok = right(sampled_scores);
      for (int k : cfg().eval().pass_at()) {
        double sum = 0;
        size_t at = 0;
        for (const auto& g : sampled) {
          int c = 0;
          for (int s = 0; s < g.samples_size(); ++s) c += ok[at++] ? 1 : 0;
          // C(n-c, k) / C(n, k) = prod_{i=n-c+1..n} (1 - k / i); 0 when n-c < k.
          double none = n - c < k ? 0.0 : 1.0;
          for (int i = n - c + 1; i <= n && none > 0; ++i) none *= 1.0 - static_cast<double>(k) / i;
          sum += 1.0 - none;
        }
        const double pk = sum / sampled.size();
        j[absl::StrCat("pass@", k)] = pk;
        absl::StrAppendFormat(&pass_line, ", pass@%d %.1f%%", k, 100 * pk);
        absl::MutexLock lock(&mu_);
        (*status_.mutable_metrics())[absl::StrCat("pass@", k)] = pk;
      }
    }
    j["seconds_eval"] = Seconds(start);
    Record(j);
    {
      absl::MutexLock lock(&mu_);
      (*status_.mutable_metrics())["accuracy"] = acc;
    }
    if (o_.progress && final) {
      std::printf("eval  %-6s held-out greedy accuracy %.1f%% (%d prompts)%s\n", label.c_str(), 100 * acc,
                  static_cast<int>(groups.size()), pass_line.c_str());
      std::fflush(stdout);
    }
    return acc;
  }

  absl::StatusOr<ScoreResponse> Score(const std::vector<TrajectoryGroup>& groups) {
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
    ScoreResponse resp;
    auto stub = RewardService::NewStub(rewards_[0]->channel());
    auto ctx = rewards_[0]->NewContext(absl::Minutes(5));
    RLMESH_RETURN_IF_ERROR(FromGrpcStatus(stub->Score(ctx.get(), req, &resp)));
    return resp;
  }

  // --- stages -----------------------------------------------------------

  bool ShouldEval(int64_t step, int64_t total) const {
    const int every = cfg().eval().every();
    return every > 0 && step % every == 0 && step != total;
  }
  // Whether an SFT stage's stop rule checks after `step`.
  static bool UntilDue(const SftUntil& u, int64_t step, int64_t total) {
    const int every = u.every() > 0 ? u.every() : 5;
    return u.eval_accuracy() > 0 && step >= u.after() && step % every == 0 && step != total;
  }

  // buffer.keep_steps / buffer.max_bytes: trims the experiment's oldest
  // rollout steps after each RL step.
  absl::Status TrimBuffer() {
    const BufferConfig& b = cfg().buffer();
    if (b.keep_steps() <= 0 && b.max_bytes() <= 0) return absl::OkStatus();
    TrimRequest req;
    req.set_experiment_id(o_.experiment_id);
    req.set_keep_steps(b.keep_steps());
    req.set_max_bytes(b.max_bytes());
    TrimResponse resp;
    auto stub = ReplayBuffer::NewStub(replay_->channel());
    auto ctx = replay_->NewContext(absl::Seconds(60));
    absl::Status s = FromGrpcStatus(stub->Trim(ctx.get(), req, &resp));
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("replay buffer Trim: ", s.message()));
    absl::MutexLock lock(&mu_);
    (*status_.mutable_metrics())["buffer_trimmed_groups"] += static_cast<double>(resp.groups_removed());
    return absl::OkStatus();
  }

  bool ShouldCheckpoint(int64_t step, int64_t total) const {
    const int every = cfg().checkpoint().every();
    return every > 0 && step % every == 0 && step != total;
  }

  // Stages whose data comes from the learner's own stage config (SFT on the
  // task, reward model and DPO on pairs): one TrainStep per step.
  absl::Status RunSft(const Stage& stage) {
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

  // Errors a restarted role explains: a process that died (UNAVAILABLE), a
  // call cut off by it (DEADLINE_EXCEEDED, ABORTED, DATA_LOSS), or a fresh
  // process that lost its state (FAILED_PRECONDITION: no model, not
  // configured).
  static bool Recoverable(const absl::Status& s) {
    switch (s.code()) {
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kDeadlineExceeded:
      case absl::StatusCode::kAborted:
      case absl::StatusCode::kDataLoss:
      case absl::StatusCode::kFailedPrecondition:
        return true;
      default:
        return false;
    }
  }

  // Runs steps until the stage is done. When a step fails because a role
  // died (the cluster restarts it on its port), waits for every role to
  // serve, re-configures the learners (they resume from their newest
  // checkpoint; FIFO cursors and acks keep the buffer consistent), reloads
  // the workers' weights, rewinds to the learners' step and goes on.
  absl::Status RunSteps(int64_t total, const std::function<absl::Status()>& step,
                        const std::function<void()>& rewind = nullptr) {
    constexpr int kMaxRecoveries = 3;
    int failures = 0;
    while (stage_step_ < total && !until_reached_) {
      RLMESH_RETURN_IF_ERROR(CheckCancelled());
      absl::Status s = step();
      if (s.ok()) {
        failures = 0;
        continue;
      }
      // A failure while cancelling is the shutdown, not a crash.
      RLMESH_RETURN_IF_ERROR(CheckCancelled());
      if (!Recoverable(s) || ++failures > kMaxRecoveries) return s;
      RLMESH_LOG(WARNING) << "step=" << stage_step_ + 1 << " failed: " << s.ToString() << "; recovering";
      if (o_.progress) {
        std::printf("recover: step %lld failed (%s); restarting from the last checkpoint\n",
                    static_cast<long long>(stage_step_ + 1), s.ToString().c_str());
        std::fflush(stdout);
      }
      RLMESH_RETURN_IF_ERROR(Recover());
      if (rewind) rewind();
      {
        absl::MutexLock lock(&mu_);
        (*status_.mutable_metrics())["recoveries"] += 1;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Recover() {
    SetPhase("recover");
    std::vector<RpcClient*> all = {replay_.get()};
    for (auto* v : {&rewards_, &rollouts_, &learners_}) {
      for (auto& c : *v) all.push_back(c.get());
    }
    for (RpcClient* c : all) RLMESH_RETURN_IF_ERROR(WaitUntilServing(*c, absl::Seconds(60)));
    // A failed sync may have reached some workers and not others: continue
    // above the highest version any of them holds.
    for (auto& r : rollouts_) {
      RolloutStatus st;
      auto stub = RolloutService::NewStub(r->channel());
      auto ctx = r->NewContext(absl::Seconds(30));
      if (stub->GetStatus(ctx.get(), RolloutStatusRequest(), &st).ok()) {
        weights_version_ = std::max(weights_version_, st.policy_version());
      }
    }
    // The restarted learner counts versions from its checkpoint; a fresh
    // sync group keeps it clear of what the dead one published.
    ++sync_generation_;
    sync_configured_ = false;
    sync_store_port_ = 0;
    const int stage_index = status().stage_index();
    RLMESH_RETURN_IF_ERROR(ConfigureLearners(stage_index, stage_init_));
    // The workers keep their policy while a reward model trains.
    if (cfg().stages(stage_index).has_reward_model()) return absl::OkStatus();
    return SyncWeights(/*through_checkpoint=*/true);
  }

  // One learner step on the stage's next groups from the buffer (FIFO per
  // stage), none older than max_staleness versions.
  absl::StatusOr<StepMetrics> TrainFromBuffer(const Stage& stage, const RlStage& rl) {
    const int64_t min_version = RolloutVersion() - rl.max_staleness();
    return TrainStep([&](TrainStepRequest* r) {
      BufferSource* b = r->mutable_buffer();
      b->set_experiment_id(o_.experiment_id);
      b->set_consumer_id(absl::StrCat("learner-", StageName(stage)));
      b->set_num_groups(rl.prompts_per_step());
      b->set_min_policy_version(min_version);
      b->set_mode(cfg().buffer().sample_mode());
      b->set_seed(MixSeed(RolloutSeed(status().stage_index(), stage_step_ + 1), 0xb0f));
    });
  }

  absl::Status RunRl(const Stage& stage) {
    const RlStage& rl = *RlSettings(stage);
    if (rl.max_staleness() > 0) return RunRlAsync(stage);
    const int64_t total = rl.steps();
    const int stage_index = status().stage_index();
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
      RLMESH_ASSIGN_OR_RETURN(auto groups, Generate(prompts, rl.samples_per_prompt(),
                                                    Sampling(false, RolloutSeed(stage_index, stage_step_ + 1)), true,
                                                    global_step_));
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
      SetPhase("train");
      const absl::Time t1 = absl::Now();
      RLMESH_ASSIGN_OR_RETURN(StepMetrics m, TrainFromBuffer(stage, rl));
      nlohmann::json j = StepRecord(stage, m);
      const double mean = count ? sum / count : 0;
      j["rollout_reward_mean"] = mean;
      j["rollout_reward_std"] = count ? std::sqrt(std::max(0.0, sq / count - mean * mean)) : 0;
      j["rollout_response_length"] = count ? len / count : 0;
      j["seconds_generate"] = gen_seconds;
      j["seconds_train"] = Seconds(t1);
      {
        absl::MutexLock lock(&mu_);
        (*status_.mutable_metrics())["reward_mean"] = mean;
      }
      return AfterStep(stage, total, &j);
    }, rewind);
  }

  // --- asynchronous RL ---------------------------------------------------

  // What the producer thread of RunRlAsync shares with the training loop.
  struct AsyncRollout {
    struct Generated {
      double reward_sum = 0, reward_sq = 0, length_sum = 0, seconds = 0;
      int count = 0;
      int64_t min_version = 0;
    };
    absl::Mutex mu;
    // Stage steps whose groups are all stored in the buffer.
    int64_t produced ABSL_GUARDED_BY(mu) = 0;
    // Stage steps trained and synced into the workers, and the workers'
    // version after each of them.
    int64_t synced ABSL_GUARDED_BY(mu) = 0;
    std::map<int64_t, int64_t> version_after ABSL_GUARDED_BY(mu);
    std::map<int64_t, Generated> generated ABSL_GUARDED_BY(mu);
    absl::Status error ABSL_GUARDED_BY(mu);
    bool stop ABSL_GUARDED_BY(mu) = false;
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

  // Asynchronous RL (max_staleness = k > 0). A producer thread generates the
  // groups of stage step i (pipeline mode: worker -> reward -> buffer) as
  // soon as the weights of step i-1-k are in the workers, while this thread
  // trains and syncs the steps before it. The learner takes step i's groups
  // FIFO with min_policy_version = its version - k, so no trained group is
  // more than k versions stale, and the stored behaviour log-probs correct
  // for the lag. A weight update waits at the workers' fence for the
  // sequences in flight (rollout.on_update), so with k = 1 generation of
  // step i+1 overlaps training of step i: a step costs max(generate, train)
  // + sync instead of their sum.
  absl::Status RunRlAsync(const Stage& stage) {
    const RlStage& rl = *RlSettings(stage);
    const int64_t total = rl.steps();
    const int64_t k = rl.max_staleness();
    const int stage_index = status().stage_index();
    PromptLoader loader(&task_->train(), cfg().seed() * 7919 + stage_index);
    AsyncRollout a;

    // (Re)starts the producer at the step after stage_step_.
    auto start = [&] {
      const int64_t first = stage_step_ + 1;
      const int64_t global_base = global_step_ - stage_step_;
      loader = PromptLoader(&task_->train(), cfg().seed() * 7919 + stage_index);
      for (int64_t done = 0; done < stage_step_; ++done) loader.NextBatch(rl.prompts_per_step());
      {
        absl::MutexLock lock(&a.mu);
        a.produced = a.synced = stage_step_;
        a.version_after.clear();
        a.version_after[stage_step_] = RolloutVersion();
        a.generated.clear();
        a.error = absl::OkStatus();
        a.stop = false;
      }
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
          auto groups = Generate(prompts, rl.samples_per_prompt(), Sampling(false, RolloutSeed(stage_index, i)),
                                 true, global_base + i, min_version);
          absl::MutexLock lock(&a.mu);
          if (!groups.ok()) {
            a.error = groups.status();
            return;
          }
          AsyncRollout::Generated& g = a.generated[i];
          g.seconds = Seconds(t0);
          g.min_version = min_version;
          for (const auto& group : *groups) {
            for (const auto& t : group.samples()) {
              g.reward_sum += t.reward();
              g.reward_sq += t.reward() * t.reward();
              g.length_sum += t.response_token_ids_size();
              ++g.count;
            }
          }
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
          if (cancelled_->load()) return absl::CancelledError("cancelled");
        }
        if (!a.error.ok()) return a.error;
        gen = a.generated[i];
        a.generated.erase(i);
      }
      const double wait_seconds = Seconds(t0);
      SetPhase("train");
      const absl::Time t1 = absl::Now();
      RLMESH_ASSIGN_OR_RETURN(StepMetrics m, TrainFromBuffer(stage, rl));
      nlohmann::json j = StepRecord(stage, m);
      const double mean = gen.count ? gen.reward_sum / gen.count : 0;
      j["rollout_reward_mean"] = mean;
      j["rollout_reward_std"] =
          gen.count ? std::sqrt(std::max(0.0, gen.reward_sq / gen.count - mean * mean)) : 0;
      j["rollout_response_length"] = gen.count ? gen.length_sum / gen.count : 0;
      // Generation ran alongside the previous steps: its own time, and how
      // long this loop still had to wait for it.
      j["seconds_generate"] = gen.seconds;
      j["seconds_wait_rollout"] = wait_seconds;
      j["seconds_train"] = Seconds(t1);
      // Versions the learner was ahead of the policy that generated the step.
      j["rollout_lag_versions"] = static_cast<double>(RolloutVersion() - 1 - gen.min_version);
      {
        absl::MutexLock lock(&mu_);
        (*status_.mutable_metrics())["reward_mean"] = mean;
      }
      RLMESH_RETURN_IF_ERROR(AfterStep(stage, total, &j));
      absl::MutexLock lock(&a.mu);
      a.synced = stage_step_;
      a.version_after[stage_step_] = RolloutVersion();
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

  nlohmann::json StepRecord(const Stage& stage, const StepMetrics& m) {
    nlohmann::json j = {{"event", "step"}, {"stage", StageName(stage)}, {"step", stage_step_},
                        {"policy_version", version_}, {"time", absl::ToUnixMicros(absl::Now()) / 1e6}};
    absl::MutexLock lock(&mu_);
    for (const auto& [k, v] : m.values()) {
      j[k] = v;
      (*status_.mutable_metrics())[k] = v;
    }
    status_.set_step(stage_step_);
    status_.set_total_steps(StageSteps(stage));
    status_.set_policy_version(version_);
    return j;
  }

  // Weight sync, periodic eval and checkpoint, metrics line and progress.
  absl::Status AfterStep(const Stage& stage, int64_t total, nlohmann::json* j) {
    const bool reward_model = stage.has_reward_model();
    if (!reward_model) {
      RLMESH_RETURN_IF_ERROR(SyncWeights());
      (*j)["seconds_sync"] = last_sync_seconds_;
    }
    if (!reward_model && ShouldEval(stage_step_, total)) {
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
        if (o_.progress) {
          std::printf("%s: held-out accuracy %.1f%% >= %.1f%% at step %lld: stage done (until.eval_accuracy)\n",
                      StageName(stage).c_str(), 100 * (*j)["accuracy"].get<double>(),
                      100 * stage.sft().until().eval_accuracy(), static_cast<long long>(stage_step_));
          std::fflush(stdout);
        }
      }
    }
    if (RlSettings(stage) != nullptr) RLMESH_RETURN_IF_ERROR(TrimBuffer());
    if (ShouldCheckpoint(stage_step_, total)) RLMESH_RETURN_IF_ERROR(SaveAll().status());
    ++tb_step_;
    Record(*j);
    if (o_.progress) PrintProgress(stage, total, *j);
    return absl::OkStatus();
  }

  // One metrics line, and every number in it as a TensorBoard scalar
  // "<stage>/<key>" at the cumulative learner step.
  void Record(const nlohmann::json& j) {
    if (metrics_.is_open()) {
      metrics_ << j.dump() << "\n";
      metrics_.flush();
    }
    if (!tensorboard_) return;
    const std::string stage = j.value("stage", std::string("run"));
    const double wall = j.value("time", 0.0);
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!it.value().is_number() || it.key() == "time" || it.key() == "step") continue;
      tensorboard_->AddScalar(absl::StrCat(stage, "/", it.key()), tb_step_, it.value().get<double>(), wall)
          .IgnoreError();
    }
  }

  void PrintProgress(const Stage& stage, int64_t total, const nlohmann::json& j) {
    if (cfg().logging().quiet()) return;
    const int64_t every = std::max<int64_t>(1, total / 20);
    if (stage_step_ % every != 0 && stage_step_ != total && !j.contains("accuracy")) return;
    auto get = [&](const char* k) { return j.contains(k) ? j[k].get<double>() : 0.0; };
    std::string line = absl::StrFormat("%-5s [%s] %3.0f%%  step %d/%d", StageName(stage),
                                       Bar(static_cast<double>(stage_step_) / total),
                                       100.0 * stage_step_ / total, stage_step_, total);
    if (stage.has_sft()) {
      absl::StrAppendFormat(&line, "  loss %.3f", get("loss"));
    } else if (stage.has_reward_model()) {
      absl::StrAppendFormat(&line, "  loss %.3f  pair acc %.0f%%  margin %.2f", get("loss"), 100 * get("rm_accuracy"),
                            get("margin"));
    } else if (stage.has_dpo()) {
      absl::StrAppendFormat(&line, "  loss %.3f  pair acc %.0f%%  margin %.3f", get("loss"), 100 * get("dpo_accuracy"),
                            get("reward_margin"));
    } else {
      const double gen = get("seconds_generate"), tr = get("seconds_train"), sy = get("seconds_sync");
      const double all = std::max(1e-9, gen + tr + sy);
      absl::StrAppendFormat(&line, "  reward %.2f  kl %.4f  gen %.0f%% train %.0f%% sync %.0f%%",
                            get("rollout_reward_mean"), get("kl"), 100 * gen / all, 100 * tr / all, 100 * sy / all);
    }
    if (j.contains("accuracy")) absl::StrAppendFormat(&line, "  acc %.0f%%", 100 * get("accuracy"));
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  void PrintSummary() {
    RunSummary s = summary();
    std::string line = "done: held-out accuracy";
    for (size_t i = 0; i < s.accuracy.size(); ++i) {
      absl::StrAppendFormat(&line, "%s %.1f%% (%s)", i == 0 ? "" : " \u2192", 100 * s.accuracy[i].second,
                            s.accuracy[i].first);
    }
    absl::StrAppendFormat(&line, " in %dm%02ds; metrics in %s/metrics.jsonl", static_cast<int>(s.seconds) / 60,
                          static_cast<int>(s.seconds) % 60, o_.run_dir);
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  RunnerOptions o_;
  std::atomic<bool>* cancelled_;
  std::unique_ptr<actor::Tokenizer> tokenizer_;
  std::unique_ptr<Task> task_;
  std::unique_ptr<RpcClient> replay_;
  std::vector<std::unique_ptr<RpcClient>> rewards_, rollouts_, learners_;
  std::ofstream metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  int64_t tb_step_ = 0;
  // Learner's policy version, and the offset to the rollout workers' numbering.
  int64_t version_ = 0;
  int64_t version_offset_ = 0;
  // Version the rollout workers hold.
  int64_t weights_version_ = 0;
  int64_t stage_step_ = 0;
  int64_t global_step_ = 0;
  // Weights the current stage started from (for re-configuring after a crash).
  std::string stage_init_;
  // The current SFT stage met its stop rule (sft.until).
  bool until_reached_ = false;
  // Port of the weight-sync store learner 0 hosts (0 = not asked yet).
  int sync_store_port_ = 0;
  bool sync_unavailable_ = false;
  bool group_sync_worked_ = false;
  bool sync_configured_ = false;
  int sync_generation_ = 0;
  double last_sync_seconds_ = 0;
  std::string last_weights_dir_;

  mutable absl::Mutex mu_;
  ExperimentStatus status_ ABSL_GUARDED_BY(mu_);
  RunSummary summary_ ABSL_GUARDED_BY(mu_);
};

ExperimentRunner::ExperimentRunner(RunnerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options), &cancelled_)) {}
ExperimentRunner::~ExperimentRunner() = default;
absl::Status ExperimentRunner::Run() { return impl_->Run(); }
ExperimentStatus ExperimentRunner::status() const { return impl_->status(); }
RunSummary ExperimentRunner::summary() const { return impl_->summary(); }

}  // namespace rlmesh
