// Every RolloutService RPC, structure-aware (fuzz/rpc_fuzz.h), against the
// real service and a worker holding a tiny Llama (rollout/testing): Generate
// with fuzzed sampling, sizes and modes, LoadWeights from fuzzed folders and
// sync layouts, ConfigureWeightSync with fuzzed groups, Sleep, GetStatus, in any
// order. This is the mix that once left a worker unable to answer GetStatus
// for 15 s. After each call GetStatus answers within the grace
// period; after every 16th, a small greedy Generate still completes (the
// worker still has a usable model, whatever was loaded into it; after a
// Sleep that released the weights, once a checkpoint load brings them back;
// a Sleep past its deadline may still release them after the status read,
// and the check then looks once more).
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "actor/tokenizer.h"
#include "common/rpc_client.h"
#include "common/testing/test_util.h"
#include "fuzz/rpc_fuzz.h"
#include "proto/rollout.grpc.pb.h"
#include "rollout/rollout_worker.h"
#include "rollout/service.h"
#include "rollout/testing/tiny_model.h"

namespace {

std::string& CheckpointDir() {
  static std::string dir = [] {
    static const rlmesh::testing::TempDir root;  // removed at exit
    if (!rlmesh::rollout::testing::WriteTinyCheckpoint(root.File("v1"), 1).ok()) std::abort();
    return root.File("v1");
  }();
  return dir;
}

grpc::Status ReadStatus(rlmesh::RpcClient& client, rlmesh::RolloutService::Stub& stub, rlmesh::RolloutStatus* status) {
  return stub.GetStatus(client.NewContext(absl::Seconds(5)).get(), rlmesh::RolloutStatusRequest(), status);
}

// Brings the weights back when `status` says a Sleep released them, then
// runs a small greedy Generate: "" when it gives one group, else what went
// wrong.
std::string LoadIfReleasedThenGenerate(rlmesh::RpcClient& client, rlmesh::RolloutService::Stub& stub,
                                       const rlmesh::RolloutStatus& status) {
  if (status.weights_released()) {
    // A fuzzed Sleep released the weights: a load must bring them back,
    // unless a fuzzed load took the largest version (no load can follow).
    if (status.policy_version() == std::numeric_limits<int64_t>::max()) return "";
    rlmesh::LoadWeightsRequest load;
    load.set_checkpoint_path(CheckpointDir());
    rlmesh::LoadWeightsResponse loaded;
    grpc::Status s = stub.LoadWeights(client.NewContext(absl::Seconds(20)).get(), load, &loaded);
    if (!s.ok()) return absl::StrCat("LoadWeights after a Sleep: ", s.error_message());
  }
  rlmesh::GenerateRequest req = rlmesh::rollout::testing::MakeRequest({"1+2="}, 1, 3, 5);
  req.mutable_sampling()->set_temperature(0);
  auto ctx = client.NewContext(absl::Seconds(20));
  auto reader = stub.Generate(ctx.get(), req);
  rlmesh::GenerateResponse r;
  int groups = 0;
  while (reader->Read(&r)) groups += r.has_group() ? 1 : 0;
  grpc::Status s = reader->Finish();
  if (!s.ok()) return absl::StrCat("a small Generate: ", s.error_message());
  if (groups != 1) return absl::StrCat("a small Generate gave ", groups, " groups");
  return "";
}

std::string Check(const std::string& address) {
  auto client = rlmesh::RpcClient::Create(address);
  if (!client.ok()) return client.status().ToString();
  auto stub = rlmesh::RolloutService::NewStub(client->channel());
  rlmesh::RolloutStatus status;
  grpc::Status s = ReadStatus(*client, *stub, &status);
  if (!s.ok()) return absl::StrCat("GetStatus: ", s.error_message());
  static int calls = 0;
  if (calls++ % 16 != 0) return "";
  std::string broken = LoadIfReleasedThenGenerate(*client, *stub, status);
  // A fuzzed Sleep whose deadline passed on the client may still be running
  // on the worker, as any call past its deadline may, and release the
  // weights between the status read and the Generate. Once it has, the
  // status says so: read it once more, and the load brings them back.
  if (!broken.empty() && ReadStatus(*client, *stub, &status).ok() && status.weights_released()) {
    broken = LoadIfReleasedThenGenerate(*client, *stub, status);
  }
  return broken;
}

rlmesh::fuzz::RpcFuzzHarness& Harness() {
  static rlmesh::fuzz::RpcFuzzHarness* harness = [] {
    static rlmesh::ServerAuth auth;
    rlmesh::rollout::RolloutWorkerOptions o;
    o.max_queue = 16;
    o.max_batch = 16;
    static rlmesh::rollout::RolloutWorker worker(o, std::make_unique<rlmesh::actor::CharTokenizer>());
    if (!worker.LoadCheckpoint(CheckpointDir(), 1).ok()) std::abort();
    static rlmesh::rollout::RolloutServiceImpl service(&worker, &auth);
    rlmesh::fuzz::RpcFuzzTarget t;
    t.services = {&service};
    t.service_names = {"rlmesh.RolloutService"};
    t.fill.known_strings = {CheckpointDir(), CheckpointDir(), "1+2=", "12+3=", "127.0.0.1", "fuzz", "finish",
                            "</calc>", "\n"};
    // A sync load waits for its publisher until the spec's timeout (60 s
    // when 0) and holds the worker's load turn meanwhile, by design: cap
    // the valid timeouts the fuzzer picks at 100 ms so one such load does
    // not turn every later load into a wait. Values outside [0, an hour]
    // stay as they are: the worker must refuse them.
    // A Generate with n, max_new_tokens or prompts unset gets 2, 4 or one
    // prompt, so
    // generation itself is reached (negative and huge n, odd prompts, still
    // come from the fuzzer).
    t.prepare = [](const google::protobuf::MethodDescriptor& m, google::protobuf::Message* req) {
      if (m.name() == "Generate") {
        auto* g = static_cast<rlmesh::GenerateRequest*>(req);
        if (g->n() == 0) g->set_n(2);
        if (g->sampling().max_new_tokens() == 0) g->mutable_sampling()->set_max_new_tokens(4);
        if (g->prompts_size() == 0) {
          *g->mutable_prompts() = rlmesh::rollout::testing::MakeRequest({"1+2="}, 1, 1, 0).prompts();
        }
        return;
      }
      if (m.name() != "ConfigureWeightSync") return;
      auto* spec = static_cast<rlmesh::ConfigureWeightSyncRequest*>(req)->mutable_spec();
      if (spec->timeout_ms() == 0 || (spec->timeout_ms() > 100 && spec->timeout_ms() <= 3'600'000)) {
        spec->set_timeout_ms(100);
      }
    };
    t.check = Check;
    // Loads that wait for the load turn answer at their deadline; keep it
    // short so such calls cost little.
    t.deadline = absl::Milliseconds(60);
    return new rlmesh::fuzz::RpcFuzzHarness(std::move(t));
  }();
  return *harness;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return Harness().Run(data, size); }
