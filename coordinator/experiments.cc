#include "coordinator/experiments.h"

#include <algorithm>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/path_root.h"
#include "common/status_macros.h"
#include "coordinator/experiment_config.h"

namespace rlmesh {

RunnerOptions RunnerOptionsFor(ExperimentConfig experiment, std::string experiment_id, std::string run_dir,
                               const ClusterAddresses& cluster) {
  RunnerOptions o;
  o.experiment = std::move(experiment);
  o.experiment_id = std::move(experiment_id);
  o.run_dir = std::move(run_dir);
  o.replay_buffer = cluster.replay_buffer;
  o.reward_servers = cluster.reward_servers;
  o.rollout_workers = cluster.rollout_workers;
  o.learners = cluster.learners;
  o.auth_token = cluster.auth_token;
  o.sync_store_host = cluster.sync_store_host;
  return o;
}

ExperimentManager::ExperimentManager(ClusterAddresses cluster) : cluster_(std::move(cluster)) {
  worker_ = std::thread([this] { Work(); });
}

ExperimentManager::~ExperimentManager() { Shutdown(); }

absl::StatusOr<std::string> ExperimentManager::Submit(ExperimentConfig config) {
  RLMESH_RETURN_IF_ERROR(NormalizeExperiment(&config, YamlSource()));
  if (config.rollout().workers() != static_cast<int>(cluster_.rollout_workers.size()) ||
      config.learner().shards() != static_cast<int>(cluster_.learners.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cluster has ", cluster_.rollout_workers.size(), " rollout workers and ", cluster_.learners.size(),
        " learners; the experiment wants rollout.workers=", config.rollout().workers(),
        " learner.shards=", config.learner().shards(), " (use --set or launch a matching cluster)"));
  }
  // What the roles of a running cluster were started with cannot change per
  // experiment: a submitted config that sets it is refused, naming it, rather
  // than silently run without it (`coordinator run` honours all of them).
  const std::pair<bool, const char*> launch_only[] = {
      {config.model().threads() != 0, "model.threads"},
      {config.rollout().max_batch() != 0, "rollout.max_batch"},
      {config.rollout().max_queue() != 0, "rollout.max_queue"},
      {config.rollout().cuda_memory_fraction() != 0, "rollout.cuda_memory_fraction"},
      {config.learner().cuda_memory_fraction() != 0, "learner.cuda_memory_fraction"},
      {!config.rollout().on_update().empty() && config.rollout().on_update() != "finish", "rollout.on_update"},
      {!config.reward().reward_model().empty(), "reward.reward_model"},
      {config.reward().reward_model_weight() != 0, "reward.reward_model_weight"},
      {config.reward().servers() != static_cast<int>(cluster_.reward_servers.size()), "reward.servers"},
      {config.environment().launch(), "environment.launch"},
  };
  for (const auto& [set, field] : launch_only) {
    if (set) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": set when the cluster's roles start; a running cluster cannot change it for one experiment "
                 "(leave it unset, or use `coordinator run`)"));
    }
  }
  if (config.logging().hang_dump_seconds() != 0) {
    return absl::FailedPreconditionError(
        "logging.hang_dump_seconds: a launched cluster watches every experiment for hangs with its "
        "coordinator's --hang_dump_seconds (leave it unset, or use `coordinator run`)");
  }
  if (cluster_.check_placement) RLMESH_RETURN_IF_ERROR(cluster_.check_placement(config));
  // The reward servers run only the command verifiers they were started
  // allowing: one the experiment names otherwise would fail at its first
  // Score, after its SFT stage.
  if (cluster_.reward_commands.has_value()) {
    const std::vector<std::string>& allowed = *cluster_.reward_commands;
    for (int i = 0; i < config.reward().verifiers_size(); ++i) {
      const VerifierConfig& v = config.reward().verifiers(i);
      if (v.name() != "command" || v.command().empty()) continue;
      if (std::find(allowed.begin(), allowed.end(), ResolvePath(v.command(0))) == allowed.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "reward.verifiers[", i, "].command: '", v.command(0),
            "' is not a program the cluster's reward servers may run (allowed: ",
            allowed.empty() ? "none" : absl::StrJoin(allowed, ", "),
            "); launch the cluster with --allowed_commands naming it, or use `coordinator run`"));
      }
    }
  }
  // The workers decode (and the reward servers read) text with the cluster's
  // tokenizer: an experiment tokenized otherwise would be scored on garbage.
  auto same_tokenizer = [](const std::string& a, const std::string& b) {
    if (a == "char" || b == "char") return a == b;
    std::error_code ec1, ec2;
    return std::filesystem::weakly_canonical(a, ec1) == std::filesystem::weakly_canonical(b, ec2);
  };
  const std::string tokenizer = config.model().tokenizer().empty() ? "char" : config.model().tokenizer();
  if (!same_tokenizer(tokenizer, cluster_.tokenizer)) {
    return absl::FailedPreconditionError(absl::StrCat("model.tokenizer: \"", tokenizer,
                                                      "\" is not the cluster's tokenizer \"", cluster_.tokenizer,
                                                      "\" (set tokenizer in the cluster YAML)"));
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("coordinator is shutting down");
  std::string id = absl::StrCat(config.name(), "-",
                                absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()));
  const std::string base = id;
  for (int k = 2; entries_.count(id); ++k) id = absl::StrCat(base, "-", k);
  auto e = std::make_unique<Entry>();
  e->id = id;
  e->config = std::move(config);
  RunnerOptions o = RunnerOptionsFor(e->config, id, absl::StrCat(cluster_.run_root, "/", id), cluster_);
  o.progress = false;
  e->runner = std::make_unique<ExperimentRunner>(std::move(o));
  entries_[id] = std::move(e);
  order_.push_back(id);
  queue_.push_back(id);
  RLMESH_LOG(INFO) << "submitted experiment=" << id;
  return id;
}

void ExperimentManager::Work() {
  while (true) {
    Entry* e = nullptr;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ExperimentManager* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(m->mu_) { return m->stopping_ || !m->queue_.empty(); },
          this));
      if (stopping_) return;
      e = entries_[queue_.front()].get();
      queue_.pop_front();
      if (e->cancelled_before_start) continue;
    }
    absl::Status s = e->runner->Run();
    RLMESH_LOG(INFO) << "experiment=" << e->id << " finished: " << s.ToString();
  }
}

absl::StatusOr<ExperimentStatus> ExperimentManager::Status(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("experiment_id: unknown experiment '", id, "'"));
  ExperimentStatus s = it->second->runner->status();
  if (it->second->cancelled_before_start) s.set_state("CANCELLED");
  return s;
}

absl::StatusOr<ExperimentStatus> ExperimentManager::Newest() const {
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    if (order_.empty()) return absl::NotFoundError("no experiments");
    id = order_.back();
  }
  return Status(id);
}

std::vector<ExperimentStatus> ExperimentManager::List() const {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    ids = order_;
  }
  std::vector<ExperimentStatus> out;
  for (const auto& id : ids) {
    auto s = Status(id);
    if (s.ok()) out.push_back(*s);
  }
  return out;
}

absl::StatusOr<std::string> ExperimentManager::Cancel(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("experiment_id: unknown experiment '", id, "'"));
  const std::string state = it->second->runner->status().state();
  if (state == "PENDING") {
    it->second->cancelled_before_start = true;
    return std::string("CANCELLED");
  }
  if (state != "RUNNING") return state;
  it->second->runner->Cancel();
  return std::string("CANCELLING");
}

void ExperimentManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    for (auto& [id, e] : entries_) e->runner->Cancel();
  }
  if (worker_.joinable()) worker_.join();
}

}  // namespace rlmesh
