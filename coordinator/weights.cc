// Weights into the rollout workers: through the weight-sync group when both
// sides support it, else through a checkpoint folder.

#include <filesystem>
#include <thread>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/run_loop.h"
#include "weight_sync/segments.h"

namespace rlmesh {

// Weight-sync segments of this run (every sync generation) outlive a killed
// publisher; the run removes them when it ends.
void RunLoop::RemoveSharedMemory() { weight_sync::RemoveSegments(ShmPrefixBase()); }

// Every sync generation's spec.shm_prefix starts with this.
std::string RunLoop::ShmPrefixBase() const { return absl::StrCat("rlmesh-", ::getpid(), "-", o_.experiment_id); }

// Puts the learner's current weights into every rollout worker.
absl::Status RunLoop::SyncWeights(bool through_checkpoint) {
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
  const std::string dir = absl::StrCat(o_.run_dir, "/weights/v", versions_.learner());
  RLMESH_ASSIGN_OR_RETURN(std::string saved, SaveAll(dir));
  RLMESH_RETURN_IF_ERROR(LoadIntoRollouts([&](LoadWeightsRequest* req) { req->set_checkpoint_path(saved); }));
  // Only the newest folder is needed.
  std::error_code ec;
  if (!last_weights_dir_.empty() && last_weights_dir_ != saved) std::filesystem::remove_all(last_weights_dir_, ec);
  last_weights_dir_ = saved;
  last_sync_seconds_ = Seconds(start);
  return absl::OkStatus();
}

absl::Status RunLoop::SyncThroughGroup() {
  const int n = static_cast<int>(clients_->rollouts.size());
  LearnerClient& learner0 = *clients_->learners[0];
  WeightSyncSpec spec;
  spec.set_backend(cfg().weight_sync().backend());
  spec.set_world_size(n + 1);
  spec.set_group_name(absl::StrCat(o_.experiment_id, "-g", sync_generation_));
  spec.set_timeout_ms(cfg().weight_sync().timeout_ms() > 0 ? cfg().weight_sync().timeout_ms() : 60000);
  spec.set_bucket_mb(cfg().weight_sync().bucket_mb());
  spec.set_shm_prefix(absl::StrCat(ShmPrefixBase(), "-g", sync_generation_));
  if (spec.backend() == WEIGHT_SYNC_GLOO || spec.backend() == WEIGHT_SYNC_NCCL) {
    // Learner 0 hosts the group's c10d store; a rebuilt group (after a
    // failure) reuses it under a new group name.
    RLMESH_ASSIGN_OR_RETURN(int port, LearnerStorePort(spec.timeout_ms()));
    spec.set_store_port(port);
    spec.set_store_host(o_.sync_store_host);
  }
  if (!sync_configured_) {
    RLMESH_RETURN_IF_ERROR(ParallelFor(n, [&](int i) -> absl::Status {
      ConfigureWeightSyncRequest req;
      *req.mutable_spec() = spec;
      req.mutable_spec()->set_rank(i + 1);
      return clients_->rollouts[i]->ConfigureWeightSync(req);
    }));
    sync_configured_ = true;
  }
  PublishWeightsRequest pub;
  *pub.mutable_spec() = spec;
  pub.mutable_spec()->set_rank(0);
  // Publisher and receivers run at the same time: for Gloo it is one
  // collective. The data carries its layout, so receivers need only the
  // learner's version.
  absl::Status publish_status;
  std::thread publisher([&] {
    publish_status = learner0.PublishWeights(pub, absl::Milliseconds(spec.timeout_ms() + 5000)).status();
  });
  const int64_t learner_version = versions_.learner();
  absl::Status load_status =
      LoadIntoRollouts([&](LoadWeightsRequest* req) { req->mutable_sync()->set_version(learner_version); });
  publisher.join();
  RLMESH_RETURN_IF_ERROR(publish_status);
  return load_status;
}

absl::Status RunLoop::LoadIntoRollouts(const std::function<void(LoadWeightsRequest*)>& fill) {
  const int64_t version = versions_.rollout();
  // Recorded before the call: a load that half-failed may have reached some
  // workers, and the next one must go above it.
  versions_.WorkersHold(version);
  RLMESH_RETURN_IF_ERROR(SaveRunnerState());
  return ParallelFor(static_cast<int>(clients_->rollouts.size()), [&](int i) -> absl::Status {
    LoadWeightsRequest req;
    fill(&req);
    req.set_version(version);
    absl::Status s = clients_->rollouts[i]->LoadWeights(req);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("rollout ", i, " LoadWeights: ", s.message()));
    return absl::OkStatus();
  });
}

}  // namespace rlmesh
