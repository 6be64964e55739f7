#pragma once

// The two policy-version numberings. A stage's learner counts from its own
// start (and a resumed or restarted learner from its checkpoint), but the
// rollout workers accept only increasing versions. The runner therefore
// shifts the learner's numbering by an offset, fixed at every Configure, so
// that the workers' versions keep increasing across stages, resumes and
// recoveries. Plain value type; not thread-safe (the runner's thread owns
// it; the async producer gets versions from it through its own lock).

#include <algorithm>
#include <cstdint>

namespace rlmesh {

class PolicyVersions {
 public:
  // The learners were (re)configured and report `learner_version`: the next
  // version the workers load is one above the highest they ever held.
  void OnConfigure(int64_t learner_version) {
    learner_ = learner_version;
    offset_ = (workers_ + 1) - learner_;
  }
  // A train step moved the learner to `learner_version`.
  void OnTrainStep(int64_t learner_version) { learner_ = learner_version; }
  // The workers hold (or may hold, after a half-done sync) `version`.
  void WorkersHold(int64_t version) { workers_ = std::max(workers_, version); }
  // Restores the workers' version saved by an earlier run (resume).
  void RestoreWorkers(int64_t version) { workers_ = version; }

  // The learner's version in its own numbering (metrics, checkpoints).
  int64_t learner() const { return learner_; }
  // The learner's version in the workers' numbering.
  int64_t rollout() const { return learner_ + offset_; }
  // The newest version any worker holds.
  int64_t workers() const { return workers_; }

 private:
  int64_t learner_ = 0;
  int64_t offset_ = 0;
  int64_t workers_ = 0;
};

}  // namespace rlmesh
