#pragma once

// Hand-written fakes of every role the experiment loop drives
// (role_clients.h), sharing one in-memory world: learners that count steps
// and versions and resume from their newest checkpoint, rollout workers that
// enforce the real workers' version rules (LoadWeights only increasing,
// Generate refused with ABORTED below min_policy_version, and with
// FAILED_PRECONDITION after a Sleep that released the weights until the next
// load) and put pipeline groups into a fake FIFO replay buffer, a reward
// server that marks a sample right when its one response token is 1, and
// fault injection.
// Everything is recorded in call order for tests to assert on.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/role_clients.h"

namespace rlmesh::testing {

// Safe for concurrent use (the runner calls shards and workers from
// several threads, and the async producer alongside the run thread).
class FakeCluster {
 public:
  struct Options {
    int learners = 1;
    int rollouts = 1;
    // Whether sample `sample` of prompt `prompt_id` is right. Default: none.
    std::function<bool(const std::string& prompt_id, int sample)> right;
    // How long a learner's TrainStep takes (lets an async producer run as
    // far ahead as the loop allows). Default: no time.
    absl::Duration train_time = absl::ZeroDuration();
    // When set, a learner's TrainStep(step) first waits (up to 10 s) until
    // this many pipeline generations have been made: an async test then
    // sees the producer as far ahead as the loop allows, whatever the
    // machine's load, instead of hoping a sleep was long enough.
    std::function<int64_t(int64_t step)> train_waits_for_generations;
  };

  // One learner train step on rank 0.
  struct Train {
    int64_t step = 0;                // the request's step (0-based)
    int64_t min_policy_version = 0;  // the request's buffer bound
    std::vector<int64_t> group_versions;  // versions of the groups it took
    int64_t groups_round = 0;        // rollout round of its first group
    std::vector<std::string> group_ids;  // ids of the groups it took
    bool from_task = false;
  };
  // One LoadWeights on a worker.
  struct Load {
    int worker = 0;
    int64_t version = 0;
    bool from_checkpoint = false;
  };
  // One Generate on a worker.
  struct Generation {
    int worker = 0;
    int64_t round = 0;
    int64_t min_policy_version = 0;
    int64_t held_version = 0;
    bool pipeline = false;
    int n = 0;
    std::vector<std::string> prompt_ids;
    std::vector<int64_t> stream_keys;
    bool hung = false;  // a HangGenerate call
  };

  explicit FakeCluster(Options options);
  ~FakeCluster();

  // Clients for one runner; they point into this cluster, which must
  // outlive them.
  std::unique_ptr<RoleClients> MakeClients();

  // The next `times` calls of `method` fail with `status` before doing
  // anything. Methods: "learner.Configure", "learner.TrainStep",
  // "learner.Save", "learner.PublishWeights", "rollout.Generate",
  // "rollout.LoadWeights", "rollout.Sleep", "reward.Score", "health.Wait".
  void FailNext(const std::string& method, absl::Status status, int times = 1);
  // The next `times` pipeline Generate calls on worker `worker`
  // stream their first `deliver_first` groups and then hang, as a stuck
  // worker does: they answer nothing more until the call's deadline
  // (DEADLINE_EXCEEDED) or, with no deadline, until a cap of 10 s
  // (UNAVAILABLE, so a loop that never cancels fails instead of hanging the
  // test). With `store_late`, a hung call still puts its other groups into
  // the buffer when it ends (a pipeline already in flight at the
  // cancellation); the fake buffer, like the real one, keeps one copy per
  // group id.
  void HangGenerate(int worker, int times = 1, int deliver_first = 0, bool store_late = false);
  // Learner rank `rank` dies when asked for train step `step` (0-based): it
  // answers `status` and, like a restarted process, forgets everything but
  // its saved checkpoints. Once.
  void CrashLearnerAt(int rank, int64_t step, absl::Status status = absl::UnavailableError("fake learner: died"));

  // The parameter dtype worker `index` reports at ConfigureWeightSync
  // ("f32" unless set).
  void SetRolloutDtype(int index, const std::string& dtype) ABSL_LOCKS_EXCLUDED(mu_);
  std::string RolloutDtype(int index) const ABSL_LOCKS_EXCLUDED(mu_);
  // The WeightSyncSpec.dtype of every PublishWeights call, in order.
  std::vector<std::string> published_dtypes() const ABSL_LOCKS_EXCLUDED(mu_);

  // "learner.Configure stage=0 step=0", "rollout.Generate pipeline",
  // "learner.TrainStep", "learner.PublishWeights", "rollout.LoadWeights",
  // "rollout.Sleep weights", "reward.Score", "learner.Save", "health.Wait",
  // ... (rank 0 and worker 0
  // only, so the order is deterministic).
  std::vector<std::string> events() const;
  std::vector<Train> trains() const;
  std::vector<Load> loads() const;
  std::vector<Generation> generations() const;
  // Groups older than a train step's min_policy_version that the buffer
  // skipped (a real buffer never hands them out either).
  int stale_skipped() const;
  // Puts of a group id already in the buffer (kept once).
  int duplicate_puts() const;

 private:
  class Learner;
  class Rollout;
  class Reward;
  class Admin;
  class Health;

  void RecordPublish(const std::string& dtype) ABSL_LOCKS_EXCLUDED(mu_);
  // Checks FailNext; records the event.
  absl::Status Enter(const std::string& method, const std::string& detail, bool log)
      ABSL_LOCKS_EXCLUDED(mu_);

  struct Group {
    int64_t version = 0;
    int64_t round = 0;
    std::string id;
  };
  struct Hang {
    int times = 0;
    int deliver_first = 0;
    bool store_late = false;
  };
  // Appends `g` unless its id is stored already (then counts a duplicate).
  void PutGroup(Group g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Checkpoint {
    int64_t step = 0;
    int64_t version = 0;
  };

  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  std::vector<Train> trains_ ABSL_GUARDED_BY(mu_);
  std::vector<Load> loads_ ABSL_GUARDED_BY(mu_);
  std::vector<Generation> generations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::pair<absl::Status, int>> failures_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::pair<int64_t, absl::Status>> crash_at_ ABSL_GUARDED_BY(mu_);
  // The replay buffer: FIFO of stored groups.
  std::deque<Group> buffer_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> stored_ids_ ABSL_GUARDED_BY(mu_);
  int stale_skipped_ ABSL_GUARDED_BY(mu_) = 0;
  int duplicate_puts_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, Hang> hangs_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::string> rollout_dtypes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> published_dtypes_ ABSL_GUARDED_BY(mu_);
  // Newest checkpoint per checkpoint dir (what a restarted learner resumes
  // from), and every folder saved by path.
  std::map<std::string, Checkpoint> newest_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Checkpoint> folders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlmesh::testing
