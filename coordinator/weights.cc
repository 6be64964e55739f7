// Weights into the rollout workers: through the weight-sync group when both
// sides support it, else through a checkpoint folder.

#include <algorithm>
#include <filesystem>
#include <thread>
#include <vector>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/experiment_config.h"
#include "coordinator/run_loop.h"
#include "weight_sync/pieces.h"
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
  last_sync_bytes_ = -1;
  if (!sync_unavailable_ && !through_checkpoint) {
    absl::Status s = SyncThroughGroup();
    if (s.ok()) {
      last_sync_seconds_ = Seconds(start);
      group_sync_worked_ = true;
      return s;
    }
    // A backend this build or host cannot run (UNIMPLEMENTED; NCCL or
    // CUDA_IPC without a GPU or library: FAILED_PRECONDITION on the first
    // try) fails the run, unless the experiment asked for checkpoint
    // folders instead; later failures are errors either way.
    const bool unavailable = s.code() == absl::StatusCode::kUnimplemented ||
                             (s.code() == absl::StatusCode::kFailedPrecondition && !group_sync_worked_);
    if (!unavailable) return s;
    if (cfg().weight_sync().fallback() != "checkpoint") {
      // Not a step to retry (the step loop retries FAILED_PRECONDITION):
      // the configuration names what this host cannot do.
      return absl::InvalidArgumentError(
          absl::StrCat("weight_sync.backend ", WeightSyncName(), " cannot run here: ", s.message(),
                       " (set weight_sync.fallback: checkpoint to sync through checkpoint folders instead)"));
    }
    RLMESH_LOG(WARNING) << "weight-sync group unavailable (" << s.message()
                        << "); syncing through checkpoint folders (weight_sync.fallback: checkpoint)";
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

std::string RunLoop::WeightSyncName() const {
  if (sync_unavailable_) return "checkpoint";
  return absl::AsciiStrToLower(absl::StripPrefix(WeightSyncBackend_Name(cfg().weight_sync().backend()), "WEIGHT_SYNC_"));
}

absl::Status RunLoop::SyncThroughGroup() {
  const int n = static_cast<int>(clients_->rollouts.size());
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
  // Resharding between split layouts: when either side is split, the
  // weights travel in pieces, each published by the learner rank that holds
  // its slice (learner.zero: 3, TP or not: learner t keeps slice t of the
  // whole world; else learner.tp: replica 0's TP rank t is learner t) and
  // received by the
  // rollout ranks whose slice it is part of; nothing whole is gathered for
  // the sync.
  const int learner_world = static_cast<int>(clients_->learners.size());
  const int slices = weight_sync::LearnerWeightSlices(cfg(), learner_world);
  const int pieces = weight_sync::ConfiguredWeightPieces(cfg(), learner_world);
  if (pieces > 1) spec.set_pieces(pieces);
  if (!sync_configured_) {
    if (pieces > 1) {
      RLMESH_LOG(INFO) << "weight sync in " << pieces << " pieces ("
                       << (cfg().learner().zero() == 3 ? absl::StrCat("learner.zero=3 over ", slices, " ranks")
                                                       : absl::StrCat("learner.tp=", slices))
                       << ", rollout.tp=" << std::max(cfg().rollout().tp(), 1) << ")";
    }
    std::vector<std::string> dtypes(n);
    RLMESH_RETURN_IF_ERROR(ParallelFor(n, [&](int i) -> absl::Status {
      ConfigureWeightSyncRequest req;
      *req.mutable_spec() = spec;
      req.mutable_spec()->set_rank(i + 1);
      RLMESH_ASSIGN_OR_RETURN(ConfigureWeightSyncResponse resp, clients_->rollouts[i]->ConfigureWeightSync(req));
      dtypes[i] = resp.dtype();
      return absl::OkStatus();
    }));
    RLMESH_ASSIGN_OR_RETURN(sync_dtype_, AgreedRolloutDtype(cfg().rollout(), dtypes));
    sync_configured_ = true;
  }
  spec.set_dtype(sync_dtype_);
  // Publishers and receivers run at the same time: for Gloo each group is
  // one collective. The data carries its layout, so receivers need only the
  // learner's version. Each publishing learner rank sends its pieces in
  // order (its calls run one at a time anyway).
  const int publishers = pieces > 1 ? slices : 1;
  const int per_learner = pieces > 1 ? pieces / publishers : 1;
  std::vector<absl::Status> publish_status(publishers);
  std::vector<int64_t> publish_bytes(publishers, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < publishers; ++t) {
    threads.emplace_back([&, t] {
      for (int c = t * per_learner; c < (t + 1) * per_learner && publish_status[t].ok(); ++c) {
        PublishWeightsRequest pub;
        *pub.mutable_spec() = pieces > 1 ? weight_sync::PieceSpec(spec, c) : spec;
        pub.mutable_spec()->set_rank(0);
        absl::StatusOr<PublishWeightsResponse> r =
            clients_->learners[t]->PublishWeights(pub, absl::Milliseconds(spec.timeout_ms() + 5000));
        if (r.ok()) {
          for (int64_t b : r->layout().bucket_bytes()) publish_bytes[t] += b;
        }
        absl::Status s = r.status();
        if (!s.ok() && pieces > 1) s = absl::Status(s.code(), absl::StrCat("learner ", t, " piece ", c, ": ", s.message()));
        publish_status[t] = s;
      }
    });
  }
  const int64_t learner_version = versions_.learner();
  absl::Status load_status =
      LoadIntoRollouts([&](LoadWeightsRequest* req) { req->mutable_sync()->set_version(learner_version); });
  for (auto& t : threads) t.join();
  for (const absl::Status& s : publish_status) RLMESH_RETURN_IF_ERROR(s);
  last_sync_bytes_ = 0;
  for (int64_t b : publish_bytes) last_sync_bytes_ += b;
  return load_status;
}

absl::StatusOr<std::string> AgreedRolloutDtype(const RolloutConfig& rollout, const std::vector<std::string>& dtypes) {
  std::string agreed;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (dtypes[i].empty()) continue;  // a worker that does not say takes what comes
    if (agreed.empty()) agreed = dtypes[i];
    if (dtypes[i] != agreed) {
      return absl::InvalidArgumentError(absl::StrCat("the rollout workers hold different dtypes (", agreed,
                                                        " and ", dtypes[i], " on worker ", i,
                                                        "): start them with the same --dtype"));
    }
  }
  const std::string wanted = WeightSyncDtypeName(rollout.dtype());
  if (!wanted.empty() && !agreed.empty() && wanted != agreed) {
    return absl::InvalidArgumentError(absl::StrCat("rollout.dtype: ", rollout.dtype(), ", but the rollout workers hold ",
                                                   agreed, " (their own --dtype)"));
  }
  return agreed;
}

absl::Status RunLoop::SleepRollouts(nlohmann::json* j) {
  if (!RolloutSleeps(cfg().rollout())) return absl::OkStatus();
  SetPhase("sleep");
  const absl::Time start = absl::Now();
  const int n = static_cast<int>(clients_->rollouts.size());
  std::vector<SleepResponse> got(n);
  SleepRequest req;
  req.set_release_weights(cfg().rollout().sleep() == "weights");
  RLMESH_RETURN_IF_ERROR(ParallelFor(n, [&](int i) -> absl::Status {
    absl::StatusOr<SleepResponse> r = clients_->rollouts[i]->Sleep(req);
    if (!r.ok()) {
      return absl::Status(r.status().code(), absl::StrCat("rollout ", i, " Sleep: ", r.status().message()));
    }
    got[i] = *r;
    return absl::OkStatus();
  }));
  double released = 0, before = 0, after = 0;
  for (const SleepResponse& r : got) {
    released += static_cast<double>(r.released_bytes());
    before += static_cast<double>(r.memory_before_bytes());
    after += static_cast<double>(r.memory_after_bytes());
  }
  (*j)["rollout_sleep_released_bytes"] = released;
  (*j)["rollout_sleep_memory_before_bytes"] = before;
  (*j)["rollout_sleep_memory_after_bytes"] = after;
  (*j)["seconds_sleep"] = Seconds(start);
  return absl::OkStatus();
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
