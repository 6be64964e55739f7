#include "coordinator/prometheus.h"

#include "catch2/catch.hpp"
#include "httplib.h"

namespace rlmesh {
namespace {

std::vector<ExperimentStatus> Two() {
  ExperimentStatus a;
  a.set_experiment_id("exp-1");
  a.set_stage("grpo");
  a.set_step(40);
  a.set_state("RUNNING");
  a.set_policy_version(41);
  (*a.mutable_metrics())["reward_mean"] = 0.5;
  ExperimentStatus b;
  b.set_experiment_id("exp\"2");
  b.set_state("SUCCEEDED");
  return {a, b};
}

TEST_CASE("experiments render as Prometheus gauges with escaped labels") {
  const std::string text = RenderPrometheus(Two());
  CHECK(text.find("rlmesh_step{experiment=\"exp-1\",stage=\"grpo\"} 40\n") != std::string::npos);
  CHECK(text.find("rlmesh_metric{experiment=\"exp-1\",stage=\"grpo\",name=\"reward_mean\"} 0.5\n") !=
        std::string::npos);
  CHECK(text.find("rlmesh_running{experiment=\"exp-1\",state=\"RUNNING\"} 1\n") != std::string::npos);
  CHECK(text.find("experiment=\"exp\\\"2\"") != std::string::npos);
  CHECK(text.find("# TYPE rlmesh_metric gauge") != std::string::npos);
}

TEST_CASE("GET /metrics on loopback serves the rendering") {
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, [] { return Two(); });
  REQUIRE(server.ok());
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  auto res = client.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->body == RenderPrometheus(Two()));
  CHECK(client.Get("/nothing")->status == 404);
}

}  // namespace
}  // namespace rlmesh
