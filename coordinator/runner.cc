#include "coordinator/runner.h"

#include "coordinator/run_loop.h"

namespace rlmesh {

ExperimentRunner::ExperimentRunner(RunnerOptions options) : ExperimentRunner(std::move(options), nullptr) {}
ExperimentRunner::ExperimentRunner(RunnerOptions options, std::unique_ptr<RoleClients> clients)
    : impl_(std::make_unique<RunLoop>(std::move(options), &cancelled_, std::move(clients))) {}
ExperimentRunner::~ExperimentRunner() = default;
absl::Status ExperimentRunner::Run() { return impl_->Run(); }
ExperimentStatus ExperimentRunner::status() const { return impl_->status(); }
RunSummary ExperimentRunner::summary() const { return impl_->summary(); }

}  // namespace rlmesh
