#pragma once

// A Prometheus text-format /metrics endpoint (cpp-httplib) for the
// coordinator: the latest metrics of every experiment as gauges.

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

// Renders experiments in the Prometheus text exposition format:
//   rlmesh_step{experiment="x",stage="grpo"} 40
//   rlmesh_metric{experiment="x",stage="grpo",name="reward_mean"} 0.41
std::string RenderPrometheus(const std::vector<ExperimentStatus>& experiments);

// Serves GET /metrics on `host:port` (0 = a free port) from a background
// thread until destroyed. `provider` is called per request, from that thread.
class MetricsHttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, std::function<std::vector<ExperimentStatus>()> provider);
  ~MetricsHttpServer();
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace rlmesh
