// Every Coordinator RPC, structure-aware (fuzz/rpc_fuzz.h), against the real
// service with an experiment manager whose roles are addresses where
// nothing listens (a config that validates is queued and its run fails) and
// a registry that roles Register with. After each call the coordinator
// still lists experiments and answers GetStatus.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc_client.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/experiments.h"
#include "fuzz/rpc_fuzz.h"
#include "proto/coordinator.grpc.pb.h"

namespace {

std::string Check(const std::string& address) {
  auto client = rlmesh::RpcClient::Create(address);
  if (!client.ok()) return client.status().ToString();
  auto stub = rlmesh::Coordinator::NewStub(client->channel());
  rlmesh::ListResponse list;
  grpc::Status s = stub->List(client->NewContext(absl::Seconds(5)).get(), rlmesh::ListRequest(), &list);
  if (!s.ok()) return absl::StrCat("List: ", s.error_message());
  rlmesh::StatusResponse status;
  s = stub->GetStatus(client->NewContext(absl::Seconds(5)).get(), rlmesh::StatusRequest(), &status);
  if (!s.ok()) return absl::StrCat("GetStatus: ", s.error_message());
  return "";
}

rlmesh::fuzz::RpcFuzzHarness& Harness() {
  static rlmesh::fuzz::RpcFuzzHarness* harness = [] {
    static rlmesh::ServerAuth auth;
    rlmesh::ClusterAddresses a;
    a.replay_buffer = "127.0.0.1:1";
    a.reward_servers = {"127.0.0.1:1"};
    a.rollout_workers = {"127.0.0.1:1"};
    a.learners = {"127.0.0.1:1"};
    const char* tmp = std::getenv("TEST_TMPDIR");
    a.run_root = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/rlmesh-coordinator-fuzz-runs");
    static rlmesh::ExperimentManager experiments(a);
    static rlmesh::CoordinatorServiceImpl service(&auth, nullptr, &experiments);
    rlmesh::fuzz::RpcFuzzTarget t;
    t.services = {&service};
    t.service_names = {"rlmesh.Coordinator"};
    t.fill.known_strings = {"learner-0",
                            "rollout",
                            "learner",
                            "replay_buffer",
                            "127.0.0.1:1",
                            "[::1]:65536",
                            "name: fuzz\nseed: 1\n",
                            "name: fuzz\nstages:\n  - sft: {steps: 1}\n",
                            "stages[0].sft.steps=3",
                            "seed=-1",
                            "fuzz"};
    t.check = Check;
    return new rlmesh::fuzz::RpcFuzzHarness(std::move(t));
  }();
  return *harness;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return Harness().Run(data, size); }
