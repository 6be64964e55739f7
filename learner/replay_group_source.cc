#include "learner/replay_group_source.h"

#include <utility>

namespace rlmesh::learner {

absl::StatusOr<std::unique_ptr<ReplayBufferGroupSource>> ReplayBufferGroupSource::Create(
    const std::string& address, const ClientOptions& options) {
  auto client = RpcClient::Create(address, options);
  if (!client.ok()) return client.status();
  return std::make_unique<ReplayBufferGroupSource>(MakeGrpcReplayBufferClient(*std::move(client)));
}

ReplayBufferGroupSource::ReplayBufferGroupSource(std::unique_ptr<ReplayBufferClient> client)
    : client_(std::move(client)) {}

absl::StatusOr<GroupSource::Sampled> ReplayBufferGroupSource::Sample(const BufferSource& source, int num_groups,
                                                                    absl::Duration timeout) {
  SampleGroupsRequest req;
  req.set_experiment_id(source.experiment_id());
  req.set_consumer_id(source.consumer_id());
  const bool fifo = source.mode().empty() || source.mode() == "fifo";
  req.set_mode(fifo ? SAMPLE_FIFO : source.mode() == "uniform" ? SAMPLE_UNIFORM : SAMPLE_PRIORITIZED);
  req.set_num_groups(num_groups);
  req.set_min_policy_version(source.min_policy_version());
  req.set_seed(source.seed());
  req.set_require_ack(fifo);
  absl::StatusOr<SampleGroupsResponse> resp = client_->SampleGroups(req, timeout);
  if (!resp.ok()) return resp.status();
  Sampled out;
  out.groups.assign(resp->groups().begin(), resp->groups().end());
  out.ack_token = resp->ack_token();
  return out;
}

absl::Status ReplayBufferGroupSource::Ack(const BufferSource& source, const std::string& ack_token) {
  AckSampleRequest req;
  req.set_experiment_id(source.experiment_id());
  req.set_consumer_id(source.consumer_id());
  req.set_ack_token(ack_token);
  return client_->AckSample(req);
}

}  // namespace rlmesh::learner
