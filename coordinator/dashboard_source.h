#pragma once

// The dashboard's view of a real cluster: experiments from the runner(s),
// roles from the Cluster, metric records from each run's metrics.jsonl,
// samples from the replay buffer over gRPC, token texts from the cluster's
// tokenizer.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actor/tokenizer.h"
#include "common/rpc_client.h"
#include "coordinator/dashboard.h"
#include "proto/replay_buffer.grpc.pb.h"

namespace rlmesh {

// Thread-safe: every member is immutable after construction or itself
// thread-safe (the callbacks, RpcClient, the stub; Tokenizer's const methods).
class ClusterDashboardSource final : public DashboardSource {
 public:
  // `experiments` and `roles` are called from the dashboard's threads.
  static absl::StatusOr<std::unique_ptr<ClusterDashboardSource>> Create(
      std::function<std::vector<ExperimentStatus>()> experiments, std::function<std::vector<RoleInfo>()> roles,
      const std::string& replay_buffer_address, const std::string& auth_token, const std::string& tokenizer_spec);

  std::vector<ExperimentStatus> Experiments() override { return experiments_(); }
  std::vector<RoleInfo> Roles() override { return roles_(); }
  absl::StatusOr<MetricsPage> Metrics(const std::string& experiment_id, int64_t from, int limit) override;
  absl::StatusOr<QueryResponse> Samples(const QueryRequest& request) override;
  std::vector<std::string> TokenTexts(const std::vector<int>& ids) override;
  std::string Decode(const std::vector<int>& ids) override;

 private:
  ClusterDashboardSource() = default;
  std::function<std::vector<ExperimentStatus>()> experiments_;
  std::function<std::vector<RoleInfo>()> roles_;
  std::unique_ptr<RpcClient> buffer_client_;
  std::unique_ptr<ReplayBuffer::Stub> buffer_;
  std::unique_ptr<actor::Tokenizer> tokenizer_;
};

}  // namespace rlmesh
