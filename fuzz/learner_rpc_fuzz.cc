// Every Learner RPC, structure-aware (fuzz/rpc_fuzz.h), against the real
// service over a Trainer confined to a temporary folder (write roots). A
// Configure whose fuzzed request has world_size 0 or 1 gets world size 1
// and the tiny experiment of the trainer tests (SFT and GRPO stages); the
// rest of the request stays fuzzed (stage, checkpoint folder, init
// checkpoint, ...), so TrainStep, Save, Load and PublishWeights reach a
// configured trainer. Other Configures keep their fuzzed experiment and
// must be refused or built, never crash. Weight-sync and store timeouts the
// fuzzer picks are capped at 100 ms, as in the rollout target, and the
// trainer's own store and Gloo waits at 200 ms. After each
// call GetStatus answers.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc_client.h"
#include "common/testing/test_util.h"
#include "fuzz/rpc_fuzz.h"
#include "learner/service.h"
#include "learner/testing/tiny_experiment.h"
#include "learner/trainer.h"
#include "proto/learner.grpc.pb.h"

namespace {

const std::string& Root() {
  static const rlmesh::testing::TempDir root;  // removed at exit
  return root.path();
}

rlmesh::ExperimentConfig Tiny() {
  rlmesh::ExperimentConfig e = rlmesh::learner::testing::TinyExperiment(7, 16);
  rlmesh::Stage* sft = e.add_stages();
  sft->mutable_sft()->set_steps(4);
  sft->mutable_sft()->set_batch(4);
  sft->mutable_sft()->mutable_optimizer()->set_lr(1e-3);
  rlmesh::Stage* grpo = e.add_stages();
  grpo->mutable_grpo()->mutable_rl()->set_steps(4);
  grpo->mutable_grpo()->mutable_rl()->mutable_optimizer()->set_lr(1e-3);
  return e;
}

std::string Check(const std::string& address) {
  auto client = rlmesh::RpcClient::Create(address);
  if (!client.ok()) return client.status().ToString();
  rlmesh::LearnerStatus status;
  const grpc::Status s = rlmesh::Learner::NewStub(client->channel())
                             ->GetStatus(client->NewContext(absl::Seconds(5)).get(), rlmesh::LearnerStatusRequest(),
                                         &status);
  if (!s.ok()) return absl::StrCat("GetStatus: ", s.error_message());
  return "";
}

void CapSyncTimeout(rlmesh::WeightSyncSpec* spec) {
  if (spec->timeout_ms() == 0 || (spec->timeout_ms() > 100 && spec->timeout_ms() <= 3'600'000)) {
    spec->set_timeout_ms(100);
  }
}

rlmesh::fuzz::RpcFuzzHarness& Harness() {
  static rlmesh::fuzz::RpcFuzzHarness* harness = [] {
    static rlmesh::ServerAuth auth;
    rlmesh::learner::TrainerOptions o;
    o.write_roots = {Root()};
    o.sample_timeout = absl::Milliseconds(200);
    o.store_timeout_ms = 200;
    // A fuzzed Configure of world size > 1 whose store answers would wait
    // for peers that never come for Gloo's 300 s default, past its client's
    // deadline, and hold the server's shutdown (a 60 s wait there was
    // seen once). Every wait the fuzzer can reach is capped.
    o.gloo.timeout_ms = 200;
    static rlmesh::learner::Trainer trainer(o);
    static rlmesh::learner::LearnerService service(&trainer, &auth);
    rlmesh::fuzz::RpcFuzzTarget t;
    t.services = {&service};
    t.service_names = {"rlmesh.Learner"};
    t.fill.known_strings = {Root() + "/ckpt", Root() + "/ckpt", Root() + "/ckpt/step_000001", Root() + "/w",
                            "127.0.0.1", "127.0.0.1:1", "fuzz"};
    t.prepare = [](const google::protobuf::MethodDescriptor& m, google::protobuf::Message* req) {
      if (m.name() == "Configure") {
        auto* c = static_cast<rlmesh::ConfigureRequest*>(req);
        if (c->world_size() == 0) c->set_world_size(1);
        if (c->world_size() == 1) *c->mutable_experiment() = Tiny();
      } else if (m.name() == "PublishWeights") {
        CapSyncTimeout(static_cast<rlmesh::PublishWeightsRequest*>(req)->mutable_spec());
      } else if (m.name() == "HostStore") {
        auto* h = static_cast<rlmesh::HostStoreRequest*>(req);
        if (h->timeout_ms() == 0 || h->timeout_ms() > 100) h->set_timeout_ms(100);
      }
    };
    t.check = Check;
    t.deadline = absl::Milliseconds(500);
    return new rlmesh::fuzz::RpcFuzzHarness(std::move(t));
  }();
  return *harness;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return Harness().Run(data, size); }
