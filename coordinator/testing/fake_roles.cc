#include "coordinator/testing/fake_roles.h"

#include <algorithm>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace rlmesh::testing {

FakeCluster::FakeCluster(Options options) : options_(std::move(options)) {}
FakeCluster::~FakeCluster() = default;

absl::Status FakeCluster::Enter(const std::string& method, const std::string& detail, bool log) {
  absl::MutexLock lock(&mu_);
  if (log) events_.push_back(detail.empty() ? method : absl::StrCat(method, " ", detail));
  auto it = failures_.find(method);
  if (it != failures_.end() && it->second.second > 0) {
    --it->second.second;
    return it->second.first;
  }
  return absl::OkStatus();
}

void FakeCluster::FailNext(const std::string& method, absl::Status status, int times) {
  absl::MutexLock lock(&mu_);
  failures_[method] = {std::move(status), times};
}

void FakeCluster::HangGenerate(int worker, int times, int deliver_first, bool store_late) {
  absl::MutexLock lock(&mu_);
  hangs_[worker] = {times, deliver_first, store_late};
}

void FakeCluster::PutGroup(Group g) {
  if (!stored_ids_.insert(g.id).second) {
    ++duplicate_puts_;
    return;
  }
  buffer_.push_back(std::move(g));
}

int FakeCluster::duplicate_puts() const {
  absl::MutexLock lock(&mu_);
  return duplicate_puts_;
}

void FakeCluster::CrashLearnerAt(int rank, int64_t step, absl::Status status) {
  absl::MutexLock lock(&mu_);
  crash_at_[rank] = {step, std::move(status)};
}

void FakeCluster::SetRolloutDtype(int index, const std::string& dtype) {
  absl::MutexLock lock(&mu_);
  rollout_dtypes_[index] = dtype;
}

std::string FakeCluster::RolloutDtype(int index) const {
  absl::MutexLock lock(&mu_);
  auto it = rollout_dtypes_.find(index);
  return it != rollout_dtypes_.end() ? it->second : "f32";
}

void FakeCluster::RecordPublish(const std::string& dtype) {
  absl::MutexLock lock(&mu_);
  published_dtypes_.push_back(dtype);
}

std::vector<std::string> FakeCluster::published_dtypes() const {
  absl::MutexLock lock(&mu_);
  return published_dtypes_;
}

std::vector<std::string> FakeCluster::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}
std::vector<FakeCluster::Train> FakeCluster::trains() const {
  absl::MutexLock lock(&mu_);
  return trains_;
}
std::vector<FakeCluster::Load> FakeCluster::loads() const {
  absl::MutexLock lock(&mu_);
  return loads_;
}
std::vector<FakeCluster::Generation> FakeCluster::generations() const {
  absl::MutexLock lock(&mu_);
  return generations_;
}
int FakeCluster::stale_skipped() const {
  absl::MutexLock lock(&mu_);
  return stale_skipped_;
}

// A learner shard: step and version counters, checkpoints in the cluster.
class FakeCluster::Learner : public LearnerClient {
 public:
  Learner(FakeCluster* c, int rank) : c_(c), rank_(rank) {}

  absl::StatusOr<ConfigureResponse> Configure(const ConfigureRequest& req) override {
    RLMESH_RETURN_IF_ERROR(c_->Enter("learner.Configure", absl::StrCat("stage=", req.stage_index()), log()));
    absl::MutexLock cl(&c_->mu_);
    absl::MutexLock lock(&mu_);
    configured_ = true;
    dir_ = req.checkpoint_dir();
    // A stage resumes from its newest checkpoint; a fresh one counts from 0
    // whatever it was initialised from.
    auto it = c_->newest_.find(dir_);
    step_ = it == c_->newest_.end() ? 0 : it->second.step;
    version_ = it == c_->newest_.end() ? 0 : it->second.version;
    if (log()) c_->events_.back() += absl::StrCat(" step=", step_);
    ConfigureResponse resp;
    resp.set_step(step_);
    resp.set_policy_version(version_);
    return resp;
  }

  absl::StatusOr<SaveResponse> Save(const SaveRequest& req) override {
    RLMESH_RETURN_IF_ERROR(c_->Enter("learner.Save", req.path().empty() ? "checkpoint" : "folder", log()));
    absl::MutexLock cl(&c_->mu_);
    absl::MutexLock lock(&mu_);
    if (!configured_) return absl::FailedPreconditionError("fake learner: not configured");
    SaveResponse resp;
    resp.set_step(step_);
    resp.set_policy_version(version_);
    if (req.path().empty()) {
      resp.set_path(absl::StrCat(dir_, "/step-", step_));
      if (rank_ == 0) c_->newest_[dir_] = {step_, version_};
    } else {
      resp.set_path(req.path());
    }
    if (rank_ == 0) c_->folders_[resp.path()] = {step_, version_};
    return resp;
  }

  absl::StatusOr<TrainStepResponse> TrainStep(const TrainStepRequest& req) override {
    RLMESH_RETURN_IF_ERROR(c_->Enter("learner.TrainStep", "", log()));
    if (c_->options_.train_time > absl::ZeroDuration()) absl::SleepFor(c_->options_.train_time);
    if (c_->options_.train_waits_for_generations) {
      const int64_t want = c_->options_.train_waits_for_generations(req.step());
      absl::MutexLock cl(&c_->mu_);
      auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_->mu_) {
        return std::count_if(c_->generations_.begin(), c_->generations_.end(),
                             [](const Generation& g) { return g.pipeline; }) >= want;
      };
      c_->mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    }
    absl::MutexLock cl(&c_->mu_);
    absl::MutexLock lock(&mu_);
    auto crash = c_->crash_at_.find(rank_);
    if (crash != c_->crash_at_.end() && crash->second.first == req.step()) {
      absl::Status status = crash->second.second;
      c_->crash_at_.erase(crash);
      configured_ = false;  // a restarted process knows nothing
      return status;
    }
    if (!configured_) return absl::FailedPreconditionError("fake learner: not configured");
    if (req.step() != step_) {
      return absl::InvalidArgumentError(absl::StrCat("step: ", req.step(), " but the learner is at ", step_));
    }
    Train t;
    t.step = req.step();
    t.from_task = req.has_from_task();
    if (req.has_buffer() && rank_ == 0) {
      const BufferSource& b = req.buffer();
      t.min_policy_version = b.min_policy_version();
      while (static_cast<int>(t.group_versions.size()) < b.num_groups() && !c_->buffer_.empty()) {
        Group g = c_->buffer_.front();
        c_->buffer_.pop_front();
        if (g.version < b.min_policy_version()) {
          ++c_->stale_skipped_;
          continue;
        }
        if (t.group_versions.empty()) t.groups_round = g.round;
        t.group_versions.push_back(g.version);
        t.group_ids.push_back(g.id);
      }
      if (static_cast<int>(t.group_versions.size()) < b.num_groups()) {
        return absl::InvalidArgumentError(
            absl::StrCat("fake buffer: ", t.group_versions.size(), " groups for ", b.num_groups()));
      }
    }
    ++step_;
    ++version_;
    if (rank_ == 0) c_->trains_.push_back(t);
    TrainStepResponse resp;
    resp.set_policy_version(version_);
    (*resp.mutable_metrics()->mutable_values())["loss"] = 1.0 / step_;
    return resp;
  }

  absl::StatusOr<HostStoreResponse> HostStore(const HostStoreRequest&) override {
    RLMESH_RETURN_IF_ERROR(c_->Enter("learner.HostStore", "", log()));
    HostStoreResponse resp;
    resp.set_port(29500);
    return resp;
  }

  absl::StatusOr<PublishWeightsResponse> PublishWeights(const PublishWeightsRequest& req, absl::Duration) override {
    RLMESH_RETURN_IF_ERROR(c_->Enter("learner.PublishWeights", "", log()));
    c_->RecordPublish(req.spec().dtype());
    absl::MutexLock lock(&mu_);
    if (!configured_) return absl::FailedPreconditionError("fake learner: not configured");
    return PublishWeightsResponse();
  }

 private:
  bool log() const { return rank_ == 0; }

  FakeCluster* const c_;
  const int rank_;
  // Lock order: c_->mu_ before mu_.
  absl::Mutex mu_;
  bool configured_ ABSL_GUARDED_BY(mu_) = false;
  std::string dir_ ABSL_GUARDED_BY(mu_);
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
};

// A rollout worker with the real one's version rules.
class FakeCluster::Rollout : public RolloutClient {
 public:
  Rollout(FakeCluster* c, int index) : c_(c), index_(index) {}

  absl::StatusOr<ConfigureWeightSyncResponse> ConfigureWeightSync(const ConfigureWeightSyncRequest&) override {
    RLMESH_RETURN_IF_ERROR(c_->Enter("rollout.ConfigureWeightSync", "", log()));
    ConfigureWeightSyncResponse resp;
    resp.set_dtype(c_->RolloutDtype(index_));
    return resp;
  }

  absl::Status LoadWeights(const LoadWeightsRequest& req) override {
    const bool folder = !req.checkpoint_path().empty();
    RLMESH_RETURN_IF_ERROR(
        c_->Enter("rollout.LoadWeights", absl::StrCat(folder ? "folder" : "sync", " v=", req.version()), log()));
    absl::MutexLock cl(&c_->mu_);
    absl::MutexLock lock(&mu_);
    if (req.version() <= held_) {
      return absl::InvalidArgumentError(
          absl::StrCat("version: ", req.version(), " must exceed the loaded version ", held_));
    }
    held_ = req.version();
    released_ = false;
    c_->loads_.push_back({index_, req.version(), folder});
    return absl::OkStatus();
  }

  absl::StatusOr<SleepResponse> Sleep(const SleepRequest& req) override {
    RLMESH_RETURN_IF_ERROR(c_->Enter("rollout.Sleep", req.release_weights() ? "weights" : "cache", log()));
    absl::MutexLock lock(&mu_);
    if (held_ < 0) return absl::FailedPreconditionError("Sleep: no weights loaded");
    SleepResponse resp;
    if (req.release_weights() && !released_) resp.set_released_bytes(1000);
    released_ = released_ || req.release_weights();
    resp.set_memory_before_bytes(5000);
    resp.set_memory_after_bytes(5000 - resp.released_bytes());
    return resp;
  }

  absl::StatusOr<RolloutStatus> GetStatus() override {
    absl::MutexLock lock(&mu_);
    RolloutStatus st;
    st.set_policy_version(held_ < 0 ? 0 : held_);
    // A stand-in for a worker with CUDA graphs: one capture, then ten
    // replays per training generation.
    st.set_cuda_graph_captures(pipeline_calls_ > 0 ? 1 : 0);
    st.set_cuda_graph_replays(10 * pipeline_calls_);
    return st;
  }

  absl::Status Generate(const GenerateRequest& req, absl::Duration timeout,
                        const std::function<absl::Status(GenerateResponse&)>& on_response) override {
    const absl::Time deadline = absl::Now() + timeout;
    RLMESH_RETURN_IF_ERROR(c_->Enter("rollout.Generate", req.pipeline() ? "pipeline" : "eval", log()));
    if (req.pipeline()) {
      absl::MutexLock lock(&mu_);
      ++pipeline_calls_;
    }
    std::vector<GenerateResponse> out;
    // Groups a hung call holds back (stored late with store_late).
    std::vector<Group> late;
    bool hung = false, store_late = false;
    {
      absl::MutexLock cl(&c_->mu_);
      absl::MutexLock lock(&mu_);
      if (held_ < 0) return absl::FailedPreconditionError("no weights loaded: call LoadWeights first");
      if (released_) return absl::FailedPreconditionError("the worker's weights were released by Sleep");
      if (req.min_policy_version() > held_) {
        return absl::AbortedError(
            absl::StrCat("min_policy_version: ", req.min_policy_version(), " but the worker holds ", held_));
      }
      int deliver = req.prompts_size();
      auto hang = c_->hangs_.find(index_);
      if (req.pipeline() && hang != c_->hangs_.end() && hang->second.times > 0) {
        --hang->second.times;
        hung = true;
        store_late = hang->second.store_late;
        deliver = std::min(deliver, hang->second.deliver_first);
      }
      c_->generations_.push_back({index_, req.step(), req.min_policy_version(), held_, req.pipeline(), req.n(), {},
                                  {}, hung});
      for (const Prompt& p : req.prompts()) {
        c_->generations_.back().prompt_ids.push_back(p.prompt_id());
        c_->generations_.back().stream_keys.push_back(p.has_stream_key() ? p.stream_key() : -1);
      }
      for (const Prompt& p : req.prompts()) {
        GenerateResponse resp;
        TrajectoryGroup* g = resp.mutable_group();
        g->set_group_id(absl::StrCat(req.experiment_id(), "/", req.step(), "/", p.prompt_id()));
        g->set_step(req.step());
        g->set_prompt_id(p.prompt_id());
        for (int i = 0; i < req.n(); ++i) {
          Trajectory* t = g->add_samples();
          const bool right = c_->options_.right && c_->options_.right(p.prompt_id(), i);
          t->set_trajectory_id(absl::StrCat(g->group_id(), "/", i));
          t->set_prompt_id(p.prompt_id());
          t->set_sample_index(i);
          *t->mutable_prompt_token_ids() = p.token_ids();
          t->add_response_token_ids(right ? 1 : 0);
          t->set_reference_answer(p.reference_answer());
          t->set_policy_version(held_);
          if (req.pipeline()) t->set_reward(right ? 1 : 0);
        }
        if (static_cast<int>(out.size()) >= deliver) {
          if (req.pipeline()) late.push_back({held_, req.step(), g->group_id()});
          continue;
        }
        if (req.pipeline()) {
          c_->PutGroup({held_, req.step(), g->group_id()});
          resp.set_stored(true);
        }
        out.push_back(std::move(resp));
      }
    }
    for (auto& resp : out) RLMESH_RETURN_IF_ERROR(on_response(resp));
    if (!hung) return absl::OkStatus();
    // Stuck: nothing more until the deadline cancels the call (capped, so a
    // caller without a deadline fails rather than hangs).
    const absl::Time cap = absl::Now() + absl::Seconds(10);
    absl::SleepFor(std::min(deadline, cap) - absl::Now());
    if (store_late) {
      absl::MutexLock cl(&c_->mu_);
      for (auto& g : late) c_->PutGroup(std::move(g));
    }
    if (deadline <= cap) return absl::DeadlineExceededError("fake rollout: deadline exceeded (stuck worker)");
    return absl::UnavailableError("fake rollout: stuck past the fake's 10 s cap (no deadline set)");
  }

 private:
  bool log() const { return index_ == 0; }

  FakeCluster* const c_;
  const int index_;
  // Lock order: c_->mu_ before mu_.
  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = -1;  // -1: no weights yet
  int64_t pipeline_calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;  // Sleep(release_weights) until the next load
};

// Marks a sample right when its one response token is 1, by the first
// verifier's label (what the runner's eval reads).
class FakeCluster::Reward : public RewardClient {
 public:
  explicit Reward(FakeCluster* c) : c_(c) {}
  absl::StatusOr<ScoreResponse> Score(const ScoreRequest& req, absl::Duration) override {
    RLMESH_RETURN_IF_ERROR(c_->Enter("reward.Score", "", true));
    const VerifierConfig& v = req.verifiers(0);
    const std::string label = v.label().empty() ? v.name() : v.label();
    ScoreResponse resp;
    for (const ScoreItem& item : req.items()) {
      ScoreResult* r = resp.add_results();
      r->set_item_id(item.item_id());
      const double score = item.completion_token_ids_size() == 1 && item.completion_token_ids(0) == 1 ? 1 : 0;
      r->set_reward(score);
      (*r->mutable_components())[label] = score;
    }
    return resp;
  }

 private:
  FakeCluster* const c_;
};

class FakeCluster::Admin : public ReplayBufferAdminClient {
 public:
  explicit Admin(FakeCluster* c) : c_(c) {}
  absl::StatusOr<TrimResponse> Trim(const TrimRequest&) override {
    RLMESH_RETURN_IF_ERROR(c_->Enter("buffer.Trim", "", true));
    return TrimResponse();
  }

 private:
  FakeCluster* const c_;
};

class FakeCluster::Health : public RoleHealth {
 public:
  Health(FakeCluster* c, std::string name) : c_(c), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  absl::Status WaitUntilServing(absl::Duration) override { return c_->Enter("health.Wait", name_, true); }

 private:
  FakeCluster* const c_;
  const std::string name_;
};

std::unique_ptr<RoleClients> FakeCluster::MakeClients() {
  auto c = std::make_unique<RoleClients>();
  c->replay_buffer = std::make_unique<Admin>(this);
  c->health.push_back(std::make_unique<Health>(this, "replay buffer"));
  c->rewards.push_back(std::make_unique<Reward>(this));
  c->health.push_back(std::make_unique<Health>(this, "reward server 0"));
  for (int i = 0; i < options_.rollouts; ++i) {
    c->rollouts.push_back(std::make_unique<Rollout>(this, i));
    c->health.push_back(std::make_unique<Health>(this, absl::StrCat("rollout ", i)));
  }
  for (int r = 0; r < options_.learners; ++r) {
    c->learners.push_back(std::make_unique<Learner>(this, r));
    c->health.push_back(std::make_unique<Health>(this, absl::StrCat("learner ", r)));
  }
  return c;
}

}  // namespace rlmesh::testing
