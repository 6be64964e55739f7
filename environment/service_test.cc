// The environment service through a real gRPC server in process, and the
// environment_server binary started as a process.
#include "environment/service.h"

#include <fstream>

#include "catch2/catch.hpp"
#include "common/rpc_server.h"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "environment/client.h"

namespace rlmesh::environment {
namespace {

TEST_CASE("Reset, Step and Close through the gRPC client") {
  EnvironmentOptions o;
  o.evaluator_path = testing::Runfile("environment/calc_eval");
  EpisodeTable table(o, EpisodeTableOptions{});
  ServerOptions so;
  RpcServer server(so);
  EnvironmentServiceImpl service(&server.auth(), &table, 2);
  server.AddService(&service);
  REQUIRE(server.Start().ok());
  auto client = MakeGrpcEnvironmentClient(*RpcClient::Create(server.address()));
  ResetRequest reset;
  reset.mutable_task()->set_reference_answer("408");
  auto ep = client->Reset(reset, absl::Seconds(5));
  REQUIRE(ep.ok());
  StepRequest step;
  step.set_episode_id(ep->episode_id());
  step.set_action_text("<calc>12*34</calc>");
  auto r = client->Step(step, absl::Seconds(5));
  REQUIRE(r.ok());
  CHECK(r->observation() == "<result>408</result>");
  step.set_action_text("408");
  auto fin = client->Step(step, absl::Seconds(5));
  REQUIRE(fin.ok());
  CHECK(fin->done());
  CHECK(fin->reward() == 1.0);
  CloseRequest close;
  close.set_episode_id(ep->episode_id());
  CHECK(client->Close(close, absl::Seconds(5)).ok());
  auto gone = client->Step(step, absl::Seconds(5));
  CHECK(gone.status().code() == absl::StatusCode::kNotFound);
  CHECK(gone.status().message().find("environment server") != std::string::npos);
  reset.mutable_task()->set_environment("nope");
  CHECK(client->Reset(reset, absl::Seconds(5)).status().code() == absl::StatusCode::kInvalidArgument);
  server.Shutdown();
}

TEST_CASE("a call to a server that does not answer ends at its deadline") {
  // Nothing listens on this address: the deadline, not a hang, ends it.
  auto client = MakeGrpcEnvironmentClient(*RpcClient::Create("127.0.0.1:1"));
  const absl::Time start = absl::Now();
  auto r = client->Step(StepRequest{}, absl::Milliseconds(300));
  CHECK_FALSE(r.ok());
  CHECK(absl::Now() - start < absl::Seconds(5));
}

TEST_CASE("environment_server binary serves the calculator") {
  testing::TempDir dir;
  auto proc = Subprocess::Start({testing::Runfile("environment/environment_server"), "--port=0",
                                 "--port_file=" + dir.File("port")},
                                dir.File("log"));
  REQUIRE(proc.ok());
  auto port = ReadPortFile(dir.File("port"), absl::Seconds(30));
  if (!port.ok()) {
    std::ifstream in(dir.File("log"));
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    FAIL("environment_server did not start: " << log);
  }
  auto client = MakeGrpcEnvironmentClient(*RpcClient::Create("127.0.0.1:" + std::to_string(*port)));
  auto ep = client->Reset(ResetRequest{}, absl::Seconds(5));
  REQUIRE(ep.ok());
  StepRequest step;
  step.set_episode_id(ep->episode_id());
  step.set_action_text("<calc>2^10-24</calc>");
  auto r = client->Step(step, absl::Seconds(5));
  REQUIRE(r.ok());
  CHECK(r->observation() == "<result>1000</result>");
  proc->Stop(absl::Seconds(5));
}

}  // namespace
}  // namespace rlmesh::environment
