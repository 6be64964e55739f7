#pragma once

// The flight recorder for hung steps: a thread that watches an experiment's
// progress (stage, step, phase) and, when it has not moved for `after`
// while the experiment runs, writes every role's thread stacks (gdb, one
// file per process, the coordinator's own included) under
// <dump_dir>/<experiment>-<stage>-<step>-<phase>/ — what people ask for
// when an NCCL collective or a reward call hangs. Once per stuck point.

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

struct HangWatchOptions {
  // How long one phase of a step may last before stacks are dumped.
  absl::Duration after = absl::Seconds(900);
  // How often progress is checked.
  absl::Duration poll = absl::Seconds(1);
  // Where the dumps go (created when needed).
  std::string dump_dir;
  // The debugger; called as `gdb -q -batch -p PID -ex "thread apply all bt"`.
  std::string gdb = "gdb";
  // Longest a single stack dump may take before the debugger is killed.
  absl::Duration dump_timeout = absl::Seconds(60);
};

// Owns its thread; the callbacks are called from it and must be
// thread-safe. Destroying it stops the thread (within one poll period, or
// after the dump in progress).
class HangWatch {
 public:
  HangWatch(HangWatchOptions options, std::function<std::optional<ExperimentStatus>()> status,
            std::function<std::vector<RoleInfo>()> roles);
  ~HangWatch();
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;

  // Folders written so far (for tests and the final message).
  std::vector<std::string> dumps() const;

 private:
  void Loop();
  void Dump(const ExperimentStatus& e, const std::string& key);

  const HangWatchOptions options_;
  const std::function<std::optional<ExperimentStatus>()> status_;
  const std::function<std::vector<RoleInfo>()> roles_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> dumps_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace rlmesh
