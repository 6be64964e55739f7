// Any language can serve RewardService: a Python server generated from our
// proto with grpcio-tools answers our C++ client.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch2/catch.hpp"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "reward_server/client.h"

namespace rlmesh {
namespace {

std::string Python() {
  const char* p = std::getenv("RLMESH_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

// Absolute path of a program on PATH.
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

TEST_CASE("a Python reward server scores for the C++ client") {
  testing::TempDir dir;
  // The proto files sit in the runfiles tree under proto/.
  const std::string proto_root = testing::Runfile("");
  auto server = Subprocess::Start({Which(Python()), testing::Runfile("reward_server/testdata/python_reward_server.py"),
                                   proto_root, dir.path(), dir.File("port")},
                                  dir.File("python.log"));
  REQUIRE(server.ok());
  auto port = ReadPortFile(dir.File("port"), absl::Seconds(60));
  if (!port.ok()) {
    std::ifstream in(dir.File("python.log"));
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    FAIL("python server did not start: " << log);
  }
  auto client = MakeGrpcRewardClient(*RpcClient::Create("127.0.0.1:" + std::to_string(*port)));
  ScoreRequest req;
  auto* a = req.add_items();
  a->set_item_id("a");
  a->set_completion_text("the answer is 42");
  a->set_reference_answer("42");
  auto* b = req.add_items();
  b->set_item_id("b");
  b->set_completion_text("41");
  b->set_reference_answer("42");
  auto resp = client->Score(req, absl::InfiniteDuration());
  REQUIRE(resp.ok());
  REQUIRE(resp->results_size() == 2);
  CHECK(resp->reward_source() == "python:endswith");
  CHECK(resp->results(0).item_id() == "a");
  CHECK(resp->results(0).reward() == 1.0);
  CHECK(resp->results(1).reward() == 0.0);
  CHECK(resp->results(0).components().at("endswith") == 1.0);
}

}  // namespace
}  // namespace rlmesh
