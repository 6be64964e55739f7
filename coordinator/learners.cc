// The learner shards: configure, train and save all of them at once.

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/experiment_config.h"
#include "coordinator/run_loop.h"
#include "coordinator/step_metrics.h"

namespace rlmesh {

absl::Status RunLoop::ConfigureLearners(int stage_index, const std::string& init) {
  SetPhase("configure");
  const int k = static_cast<int>(clients_->learners.size());
  const std::string stage_name = StageName(cfg().stages(stage_index));
  // The shards rendezvous in the store learner 0 hosts (reachable from
  // every host at sync_store_host), under a prefix of this configuration's
  // own: a group rebuilt after a failure never reads the dead one's keys.
  std::string store, prefix;
  if (k > 1) {
    RLMESH_ASSIGN_OR_RETURN(int port, LearnerStorePort(/*timeout_ms=*/0));
    store = absl::StrCat(o_.sync_store_host, ":", port);
    prefix = absl::StrCat(o_.experiment_id, "/learners/", stage_index, "-", stage_name, "/",
                          learner_group_generation_++);
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
    req.set_store_prefix(prefix);
    req.set_checkpoint_dir(absl::StrCat(o_.run_dir, "/checkpoints/", stage_index, "-", stage_name));
    req.set_replay_buffer_address(o_.replay_buffer);
    absl::StatusOr<ConfigureResponse> resp = clients_->learners[r]->Configure(req);
    if (!resp.ok()) {
      return absl::Status(resp.status().code(), absl::StrCat("learner ", r, " Configure: ", resp.status().message()));
    }
    responses[r] = *std::move(resp);
    return absl::OkStatus();
  }));
  stage_step_ = responses[0].step();
  versions_.OnConfigure(responses[0].policy_version());
  return absl::OkStatus();
}

absl::StatusOr<int> RunLoop::LearnerStorePort(int64_t timeout_ms) {
  if (store_port_ != 0) return store_port_;
  HostStoreRequest req;
  req.set_timeout_ms(timeout_ms);
  absl::StatusOr<HostStoreResponse> resp = clients_->learners[0]->HostStore(req);
  if (!resp.ok()) {
    return absl::Status(resp.status().code(), absl::StrCat("learner 0 HostStore: ", resp.status().message()));
  }
  store_port_ = resp->port();
  RLMESH_LOG(INFO) << "c10d store (learner 0) on " << o_.sync_store_host << ":" << store_port_;
  return store_port_;
}

absl::StatusOr<std::string> RunLoop::SaveAll(const std::string& path) {
  SetPhase("checkpoint");
  const int k = static_cast<int>(clients_->learners.size());
  std::vector<SaveResponse> responses(k);
  RLMESH_RETURN_IF_ERROR(ParallelFor(k, [&](int r) -> absl::Status {
    SaveRequest req;
    req.set_path(path);
    absl::StatusOr<SaveResponse> resp = clients_->learners[r]->Save(req);
    if (!resp.ok()) {
      return absl::Status(resp.status().code(), absl::StrCat("learner ", r, " Save: ", resp.status().message()));
    }
    responses[r] = *std::move(resp);
    return absl::OkStatus();
  }));
  return responses[0].path();
}

absl::StatusOr<StepMetrics> RunLoop::TrainStep(const std::function<void(TrainStepRequest*)>& fill) {
  const int k = static_cast<int>(clients_->learners.size());
  std::vector<TrainStepResponse> responses(k);
  RLMESH_RETURN_IF_ERROR(ParallelFor(k, [&](int r) -> absl::Status {
    TrainStepRequest req;
    req.set_step(stage_step_);  // 0-based: the number of steps already taken
    fill(&req);
    absl::StatusOr<TrainStepResponse> resp = clients_->learners[r]->TrainStep(req);
    if (!resp.ok()) {
      return absl::Status(resp.status().code(), absl::StrCat("learner ", r, " TrainStep: ", resp.status().message()));
    }
    responses[r] = *std::move(resp);
    return absl::OkStatus();
  }));
  ++stage_step_;
  versions_.OnTrainStep(responses[0].policy_version());
  // Each rank measured its own share of the batch: the logged row merges
  // the data-parallel replicas (coordinator/step_metrics.h).
  std::vector<StepMetrics> metrics;
  for (const TrainStepResponse& resp : responses) metrics.push_back(resp.metrics());
  // One report per replica: its first rank's (a pipeline's stages share the
  // last stage's metrics, context-parallel ranks their means).
  return MergeStepMetrics(metrics, std::max(1, cfg().learner().tp()) * std::max(1, cfg().learner().pp()) *
                                       std::max(1, cfg().learner().cp()));
}

absl::StatusOr<StepMetrics> RunLoop::TrainFromBuffer(const Stage& stage, const RlStage& rl, int num_groups) {
  const int64_t min_version = versions_.rollout() - rl.max_staleness();
  return TrainStep([&](TrainStepRequest* r) {
    BufferSource* b = r->mutable_buffer();
    b->set_experiment_id(o_.experiment_id);
    b->set_consumer_id(absl::StrCat("learner-", StageName(stage)));
    b->set_num_groups(num_groups > 0 ? num_groups : rl.prompts_per_step());
    b->set_min_policy_version(min_version);
    b->set_mode(cfg().buffer().sample_mode());
    b->set_seed(MixSeed(RolloutSeed(stage_index_, stage_step_ + 1), 0xb0f));
  });
}

}  // namespace rlmesh
