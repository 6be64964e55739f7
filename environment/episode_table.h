#pragma once

// EpisodeTable: the live episodes of an environment server, keyed by id.
// Reset makes one, Step answers a turn, Close frees it; an episode idle for
// longer than idle_timeout is dropped on the next Reset (a rollout worker
// that died never closes its episodes), and at most max_episodes live at
// once (RESOURCE_EXHAUSTED beyond).
//
// Safe for concurrent use. Steps of one episode run one at a time (its own
// mutex, taken without the table's); steps of different episodes run in
// parallel. Lock order: Entry::mu is never held while taking mu_.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "environment/episode.h"

namespace rlmesh::environment {

struct EpisodeTableOptions {
  // Live episodes before Reset says RESOURCE_EXHAUSTED. Default 65536.
  int64_t max_episodes = 65536;
  // An episode untouched this long is dropped. Default 10 min.
  absl::Duration idle_timeout = absl::Minutes(10);

  absl::Status Validate() const;
};

class EpisodeTable {
 public:
  EpisodeTable(EnvironmentOptions env, EpisodeTableOptions options);

  absl::StatusOr<ResetResponse> Reset(const ResetRequest& request);
  // NOT_FOUND for an unknown, closed or expired episode.
  absl::StatusOr<StepResponse> Step(const StepRequest& request);
  // Idempotent.
  void Close(const std::string& episode_id);

  int64_t size() const;

 private:
  struct Entry {
    absl::Mutex mu;
    std::unique_ptr<Episode> episode ABSL_GUARDED_BY(mu);
  };
  void ExpireIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const EnvironmentOptions env_;
  const EpisodeTableOptions options_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, std::shared_ptr<Entry>> episodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> last_used_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlmesh::environment
