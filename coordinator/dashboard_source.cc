#include "coordinator/dashboard_source.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace rlmesh {

absl::StatusOr<std::unique_ptr<ClusterDashboardSource>> ClusterDashboardSource::Create(
    std::function<std::vector<ExperimentStatus>()> experiments, std::function<std::vector<RoleInfo>()> roles,
    const std::string& replay_buffer_address, const std::string& auth_token, const std::string& tokenizer_spec) {
  std::unique_ptr<ClusterDashboardSource> s(new ClusterDashboardSource());
  s->experiments_ = std::move(experiments);
  s->roles_ = std::move(roles);
  ClientOptions o;
  o.auth_token = auth_token;
  o.default_timeout = absl::Seconds(10);
  auto client = RpcClient::Create(replay_buffer_address, o);
  if (!client.ok()) return client.status();
  s->buffer_client_ = std::make_unique<RpcClient>(std::move(*client));
  s->buffer_ = ReplayBuffer::NewStub(s->buffer_client_->channel());
  auto tok = actor::LoadTokenizer(tokenizer_spec);
  if (!tok.ok()) return tok.status();
  s->tokenizer_ = std::move(*tok);
  return s;
}

absl::StatusOr<MetricsPage> ClusterDashboardSource::Metrics(const std::string& experiment_id, int64_t from,
                                                            int limit) {
  for (const auto& e : experiments_()) {
    if (e.experiment_id() == experiment_id) return ReadExperimentMetrics(e, from, limit);
  }
  return absl::NotFoundError(absl::StrCat("experiment: unknown experiment '", experiment_id, "'"));
}

absl::StatusOr<QueryResponse> ClusterDashboardSource::Samples(const QueryRequest& request) {
  QueryResponse resp;
  auto ctx = buffer_client_->NewContext();
  grpc::Status s = buffer_->Query(ctx.get(), request, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

std::vector<std::string> ClusterDashboardSource::TokenTexts(const std::vector<int>& ids) {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (int id : ids) out.push_back(tokenizer_->Decode({id}));
  return out;
}

std::string ClusterDashboardSource::Decode(const std::vector<int>& ids) { return tokenizer_->Decode(ids); }

}  // namespace rlmesh
