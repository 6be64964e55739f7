// Multi-turn rollouts across processes: a rollout_worker binary drives
// episodes of an environment server written in Python (generated from
// proto/environment.proto with grpcio-tools), and of our environment_server.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "actor/tokenizer.h"
#include "common/grpc_status.h"
#include "common/rpc_client.h"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "proto/rollout.grpc.pb.h"
#include "rollout/testing/tiny_model.h"
// Last: LibTorch (through tiny_model.h) defines a CHECK of its own.
#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

using ::rlmesh::testing::Runfile;
using ::rlmesh::testing::TempDir;

std::string Python() {
  const char* p = std::getenv("RLMESH_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

std::string Which(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Starts argv (with --port_file appended by the caller's args) and reads
// its port; FAILs with its log when it does not come up.
std::pair<Subprocess, int> Start(const std::vector<std::string>& argv, const std::string& port_file,
                                 const std::string& log) {
  auto p = Subprocess::Start(argv, log);
  REQUIRE(p.ok());
  auto port = ReadPortFile(port_file, absl::Seconds(90));
  if (!port.ok()) FAIL(argv[0] << " did not start: " << ReadAll(log));
  return {std::move(*p), *port};
}

std::vector<GenerateResponse> Generate(const RpcClient& client, const GenerateRequest& req, absl::Status* status) {
  auto stub = RolloutService::NewStub(client.channel());
  auto ctx = client.NewContext(absl::Seconds(120));
  auto reader = stub->Generate(ctx.get(), req);
  std::vector<GenerateResponse> out;
  GenerateResponse r;
  while (reader->Read(&r)) out.push_back(r);
  *status = FromGrpcStatus(reader->Finish());
  return out;
}

TEST_CASE("a rollout worker runs multi-turn episodes of a Python environment server") {
  TempDir dir;
  REQUIRE(rollout::testing::WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  auto [env, env_port] = Start({Which(Python()), Runfile("environment/testdata/python_environment_server.py"),
                                Runfile(""), dir.path(), dir.File("env.port")},
                               dir.File("env.port"), dir.File("env.log"));
  auto [worker, worker_port] =
      Start({Runfile("rollout/rollout_worker"), "--port=0", "--port_file=" + dir.File("worker.port"),
             "--checkpoint=" + dir.File("v1"), "--threads=1"},
            dir.File("worker.port"), dir.File("worker.log"));
  auto client = RpcClient::Create(absl::StrCat("127.0.0.1:", worker_port));
  REQUIRE(client.ok());
  REQUIRE(WaitUntilServing(*client, absl::Seconds(60)).ok());

  GenerateRequest req = rollout::testing::MakeRequest({"3+4=", "abc"}, 2, 3, 11);
  req.set_decode_text(true);
  EnvironmentConfig* e = req.mutable_environment();
  e->set_address(absl::StrCat("127.0.0.1:", env_port));
  e->set_max_turns(4);
  e->add_stop_markers("</calc>");
  e->set_timeout_ms(10000);
  absl::Status status;
  auto groups = Generate(*client, req, &status);
  REQUIRE(status.ok());
  REQUIRE(groups.size() == 2);
  actor::CharTokenizer tok;
  for (const auto& resp : groups) {
    for (const Trajectory& t : resp.group().samples()) {
      INFO(t.trajectory_id() << " " << t.response_text());
      // "[" | 3 model | "<0>" (token ids from Python) | 3 model: the
      // second step says done, so its "<1>" is not appended.
      REQUIRE(t.response_token_ids_size() == 1 + 3 + 3 + 3);
      const std::vector<int> mask = {0, 1, 1, 1, 0, 0, 0, 1, 1, 1};
      for (int k = 0; k < 10; ++k) CHECK(t.loss_mask(k) == mask[k]);
      CHECK(tok.Decode({t.response_token_ids(0)}) == "[");
      CHECK(tok.Decode({t.response_token_ids(4), t.response_token_ids(5), t.response_token_ids(6)}) == "<0>");
      for (int k : {0, 4, 5, 6}) CHECK(t.behaviour_logprobs(k) == 0.0f);
      for (int k : {1, 2, 3, 7, 8, 9}) CHECK(t.behaviour_logprobs(k) < 0.0f);
      REQUIRE(t.turns_size() == 4);
      CHECK(t.turns(1).info().at("tokens") == "3");
      CHECK(t.turns(1).info().at("turn") == "0");
      CHECK(t.turns(3).info().at("turn") == "1");
      CHECK(t.environment_reward() == 1.0);
      CHECK(t.reward() == 1.0);
      CHECK(t.episode_id().rfind("py-", 0) == 0);
    }
  }
  env.Stop(absl::Seconds(5));
  worker.Stop(absl::Seconds(10));
}

TEST_CASE("a rollout worker drives the arithmetic environment of environment_server") {
  TempDir dir;
  REQUIRE(rollout::testing::WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  auto [env, env_port] = Start({Runfile("environment/environment_server"), "--port=0",
                                "--port_file=" + dir.File("env.port"), "--default_environment=arithmetic"},
                               dir.File("env.port"), dir.File("env.log"));
  auto [worker, worker_port] =
      Start({Runfile("rollout/rollout_worker"), "--port=0", "--port_file=" + dir.File("worker.port"),
             "--checkpoint=" + dir.File("v1"), "--threads=1"},
            dir.File("worker.port"), dir.File("worker.log"));
  auto client = RpcClient::Create(absl::StrCat("127.0.0.1:", worker_port));
  REQUIRE(client.ok());
  REQUIRE(WaitUntilServing(*client, absl::Seconds(60)).ok());
  GenerateRequest req = rollout::testing::MakeRequest({"go"}, 1, 2, 3);
  (*req.mutable_prompts(0)->mutable_metadata())["steps"] = "2";
  (*req.mutable_prompts(0)->mutable_metadata())["digits"] = "1";
  EnvironmentConfig* e = req.mutable_environment();
  e->set_address(absl::StrCat("127.0.0.1:", env_port));
  e->set_max_turns(5);
  e->add_stop_markers("\n");
  absl::Status status;
  auto groups = Generate(*client, req, &status);
  REQUIRE(status.ok());
  REQUIRE(groups.size() == 1);
  const Trajectory& t = groups[0].group().samples(0);
  // "Q1: a+b=" | 2 model | " correct|wrong (s)\nQ2: c+d=" | 2 model; done.
  REQUIRE(t.turns_size() == 4);
  CHECK(t.turns(0).source() == Turn::SOURCE_ENVIRONMENT);
  CHECK(t.turns(2).source() == Turn::SOURCE_ENVIRONMENT);
  std::vector<int> q1(t.response_token_ids().begin(), t.response_token_ids().begin() + t.turns(0).token_end());
  actor::CharTokenizer tok;
  CHECK(tok.Decode(q1).rfind("Q1: ", 0) == 0);
  CHECK(t.turns(1).info().count("expected") == 1);
  CHECK(t.turns(3).token_end() == t.response_token_ids_size());
  env.Stop(absl::Seconds(5));
  worker.Stop(absl::Seconds(10));
}

}  // namespace
}  // namespace rlmesh
