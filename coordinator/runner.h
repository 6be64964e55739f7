#pragma once

// Drives one experiment through its stages over the roles' RPCs:
//   sample prompts -> rollout workers (pipeline: reward -> replay buffer)
//   -> learner steps (pulling from the buffer) -> weight sync -> eval.
// The coordinator is control plane only: trajectories flow rollout ->
// reward -> buffer -> learner; only eval completions come back here.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/role_clients.h"
#include "coordinator/runner_options.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

// Run() is called once, from one thread; status(), summary() and Cancel()
// from any. The loop itself lives in run_loop.h.
class RunLoop;
class ExperimentRunner {
 public:
  // Connects to the roles at the options' addresses over gRPC.
  explicit ExperimentRunner(RunnerOptions options);
  // Drives `clients` instead (tests: coordinator/testing/fake_roles.h); the
  // options' addresses must still be set but are not dialled.
  ExperimentRunner(RunnerOptions options, std::unique_ptr<RoleClients> clients);
  ~ExperimentRunner();

  // Runs every stage; returns when done, failed or cancelled (CANCELLED).
  absl::Status Run();
  // Asks Run() to stop at the next step boundary.
  void Cancel() { cancelled_.store(true); }
  // A snapshot for `coordinator status`.
  ExperimentStatus status() const;
  RunSummary summary() const;

 private:
  // Declared before impl_, which holds a pointer to it.
  std::atomic<bool> cancelled_{false};
  std::unique_ptr<RunLoop> impl_;
};

}  // namespace rlmesh
