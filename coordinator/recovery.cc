// The step loop that survives a dead role. When a step fails because a
// role died (the cluster restarts it on its port), it waits for every role
// to serve, re-configures the learners (they resume from their newest
// checkpoint; FIFO cursors and acks keep the buffer consistent), reloads
// the workers' weights through a fresh sync group, rewinds to the learners'
// step and goes on: at most kMaxRecoveries times for one step.

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/run_loop.h"

namespace rlmesh {

// A process that died (UNAVAILABLE), a call cut off by it
// (DEADLINE_EXCEEDED, ABORTED, DATA_LOSS), or a fresh process that lost its
// state (FAILED_PRECONDITION: no model, not configured).
bool Recoverable(const absl::Status& s) {
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

absl::Status RunLoop::RunSteps(int64_t total, const std::function<absl::Status()>& step,
                               const std::function<void()>& rewind) {
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
    Print(absl::StrCat("recover: step ", stage_step_ + 1, " failed (", s.ToString(),
                       "); restarting from the last checkpoint"));
    // A role can die during the recovery too (another kill, a restart that
    // crashes): that is one more failure of this step, not the end of the run.
    for (absl::Status r = Recover(); !r.ok(); r = Recover()) {
      RLMESH_RETURN_IF_ERROR(CheckCancelled());
      if (!Recoverable(r) || ++failures > kMaxRecoveries) return r;
      RLMESH_LOG(WARNING) << "step=" << stage_step_ + 1 << " recovery failed: " << r.ToString() << "; again";
    }
    if (rewind) rewind();
    AddMetric("recoveries", 1);
  }
  return absl::OkStatus();
}

absl::Status RunLoop::Recover() {
  SetPhase("recover");
  for (auto& h : clients_->health) RLMESH_RETURN_IF_ERROR(h->WaitUntilServing(absl::Seconds(60)));
  // A failed sync may have reached some workers and not others: continue
  // above the highest version any of them holds.
  for (auto& r : clients_->rollouts) {
    absl::StatusOr<RolloutStatus> st = r->GetStatus();
    if (st.ok()) versions_.WorkersHold(st->policy_version());
  }
  // The restarted learner counts versions from its checkpoint; a fresh sync
  // group keeps it clear of what the dead one published.
  ++sync_generation_;
  sync_configured_ = false;
  store_port_ = 0;
  RLMESH_RETURN_IF_ERROR(ConfigureLearners(stage_index_, stage_init_));
  // The workers keep their policy while a reward model trains.
  if (cfg().stages(stage_index_).has_reward_model()) return absl::OkStatus();
  return SyncWeights(/*through_checkpoint=*/true);
}

}  // namespace rlmesh
