#pragma once

// The coordinator's web dashboard: one page (coordinator/dashboard/index.html,
// compiled into the binary; no CDN, the machines are offline) and a small
// JSON API it polls:
//
//   GET /                                  the page
//   GET /api/experiments                   every experiment's status
//   GET /api/roles                         every role's health, restarts, heartbeat
//   GET /api/metrics?experiment=ID&from=N  metric records N.. of the run
//   GET /api/samples?experiment=ID&...     trajectories from the replay buffer
//                                          (min_step, max_step, min_reward,
//                                          max_reward, min_version, max_version,
//                                          text, limit, page_token)
//
// Same auth as the RPCs: with a token, every request must carry
// "Authorization: Bearer <token>" or the cookie the page sets after it was
// opened once as /?token=<token>; others get 401.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/metrics_log.h"
#include "proto/coordinator.pb.h"
#include "proto/replay_buffer.pb.h"

namespace rlmesh {

// What the dashboard shows. Implementations are called from the HTTP
// server's threads, concurrently: they must be thread-safe.
class DashboardSource {
 public:
  virtual ~DashboardSource() = default;
  virtual std::vector<ExperimentStatus> Experiments() = 0;
  virtual std::vector<RoleInfo> Roles() = 0;
  virtual absl::StatusOr<MetricsPage> Metrics(const std::string& experiment_id, int64_t from, int limit) = 0;
  // A replay-buffer query (the caller's deadline applies inside).
  virtual absl::StatusOr<QueryResponse> Samples(const QueryRequest& request) = 0;
  // Text of token ids (the cluster's tokenizer); one string per id for
  // per-token colouring, and the whole prompt.
  virtual std::vector<std::string> TokenTexts(const std::vector<int>& ids) = 0;
  virtual std::string Decode(const std::vector<int>& ids) = 0;
};

struct DashboardOptions {
  // Interface to listen on. Default loopback.
  std::string host = "127.0.0.1";
  // Port; 0 = a free one.
  int port = 0;
  // Bearer token every request must carry; "" = open.
  std::string auth_token;
};

// Parses /api/samples' query parameters into a replay-buffer query.
// INVALID_ARGUMENT naming the parameter for a bad number or range.
absl::StatusOr<QueryRequest> SamplesQuery(const std::vector<std::pair<std::string, std::string>>& params);

// Serves until destroyed. Thread-safe to destroy from any thread but the
// server's own.
class DashboardServer {
 public:
  static absl::StatusOr<std::unique_ptr<DashboardServer>> Start(const DashboardOptions& options,
                                                                DashboardSource* source);
  ~DashboardServer();
  int port() const { return port_; }

 private:
  struct Impl;
  DashboardServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::thread thread_;
};

// The page, compiled in from coordinator/dashboard/index.html.
extern const char kDashboardHtml[];

}  // namespace rlmesh
