#pragma once

// A child process handle: the coordinator launches roles with it and tests
// start real binaries with it. The destructor kills (SIGKILL) and reaps a
// child that is still running, so nothing outlives its owner by accident.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rlmesh {

// Not thread-safe; owned by one thread.
class Subprocess {
 public:
  // Starts argv[0] (a path) with argv. stdout and stderr go to `log_path`
  // (appended) when non-empty, else are inherited. The child gets SIGTERM
  // and SIGINT unblocked, runs in a process group of its own (a terminal's
  // Ctrl-C reaches only the parent) and dies with its parent
  // (PR_SET_PDEATHSIG). `env` entries ("NAME=VALUE") replace or add to the
  // environment the child inherits (INVALID_ARGUMENT for one without '=').
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::string& log_path = "",
                                          const std::vector<std::string>& env = {});

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool running();

  // Sends a signal. No-op once reaped.
  void Signal(int sig);

  // Waits up to `timeout` for exit; returns the raw wait status, or
  // DEADLINE_EXCEEDED if still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // SIGTERM, wait up to `grace`, then SIGKILL; returns the wait status.
  int Stop(absl::Duration grace);

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
};

// "exit 0", "exit 3", "signal 9" for a wait status.
std::string DescribeWaitStatus(int status);

// Polls `path` until it holds a port number or `timeout` passes.
absl::StatusOr<int> ReadPortFile(const std::string& path, absl::Duration timeout);

}  // namespace rlmesh
