// Every EnvironmentService RPC, structure-aware (fuzz/rpc_fuzz.h), against
// the real service and its built-in environments (the calculator runs
// calc_eval in its sandbox). A Step that names no episode or "@fresh" gets
// a calculator or arithmetic episode Reset just before, so steps reach live
// episodes and not only unknown ids. After each call the service answers a
// health check, and after every 32nd it still resets and steps a calculator
// episode and answers 2*21 with 42 (a sandboxed run each time).
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc_client.h"
#include "common/sanitizers.h"
#include "environment/episode_table.h"
#include "environment/service.h"
#include "fuzz/rpc_fuzz.h"
#include "proto/environment.grpc.pb.h"

namespace {

// calc_eval beside this binary's package: bazel-bin/fuzz/X ->
// bazel-bin/environment/calc_eval, in the test and the fuzz build alike.
std::string EvaluatorPath() {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) std::abort();
  std::string dir(self, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  dir = dir.substr(0, dir.rfind('/'));
  return dir + "/environment/calc_eval";
}

rlmesh::environment::EpisodeTable& Table() {
  static auto* table = [] {
    rlmesh::environment::EnvironmentOptions o;
    o.evaluator_path = EvaluatorPath();
    if (::access(o.evaluator_path.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "environment_rpc_fuzz: no evaluator at %s\n", o.evaluator_path.c_str());
      std::abort();
    }
    o.sandbox.wall_timeout = absl::Seconds(2);
#if RLMESH_ASAN
    // calc_eval is built with ASan too here, and ASan reserves terabytes of
    // address space: the default limit would stop it before main.
    o.sandbox.address_space_bytes = std::numeric_limits<int64_t>::max();
#endif
    rlmesh::environment::EpisodeTableOptions t;
    t.max_episodes = 4096;
    // Fuzzed Resets are seldom closed (their ids come back to the fuzzer
    // only by chance); a short idle expiry keeps the table below its cap
    // as the 10-minute default does at a real worker's call rate.
    t.idle_timeout = absl::Seconds(2);
    return new rlmesh::environment::EpisodeTable(o, t);
  }();
  return *table;
}

// A calculator episode answers a tool call (every 32nd call).
std::string Check(const std::string& address) {
  static int calls = 0;
  if (calls++ % 32 != 0) return "";
  auto client = rlmesh::RpcClient::Create(address);
  if (!client.ok()) return client.status().ToString();
  auto stub = rlmesh::EnvironmentService::NewStub(client->channel());
  rlmesh::ResetRequest reset;
  reset.mutable_task()->set_environment("calculator");
  reset.mutable_task()->set_reference_answer("42");
  rlmesh::ResetResponse episode;
  grpc::Status s = stub->Reset(client->NewContext(absl::Seconds(5)).get(), reset, &episode);
  if (!s.ok()) return absl::StrCat("Reset: ", s.error_message());
  rlmesh::StepRequest step;
  step.set_episode_id(episode.episode_id());
  step.set_action_text("<calc>2*21</calc>");
  rlmesh::StepResponse answer;
  s = stub->Step(client->NewContext(absl::Seconds(5)).get(), step, &answer);
  if (!s.ok()) return absl::StrCat("Step: ", s.error_message());
  rlmesh::CloseRequest close;
  close.set_episode_id(episode.episode_id());
  rlmesh::CloseResponse closed;
  (void)stub->Close(client->NewContext(absl::Seconds(5)).get(), close, &closed);
  if (answer.observation().find("42") == std::string::npos) {
    return absl::StrCat("the calculator answered '", answer.observation(), "' to 2*21");
  }
  return "";
}

rlmesh::fuzz::RpcFuzzHarness& Harness() {
  static rlmesh::fuzz::RpcFuzzHarness* harness = [] {
    static rlmesh::ServerAuth auth;
    static rlmesh::environment::EnvironmentServiceImpl service(&auth, &Table(), 4);
    rlmesh::fuzz::RpcFuzzTarget t;
    t.services = {&service};
    t.service_names = {"rlmesh.EnvironmentService"};
    t.fill.known_strings = {"@fresh",         "@fresh", "calculator", "arithmetic", "steps",  "digits",
                            "<calc>2*3</calc>", "<calc>1/0</calc>", "<calc>((((((((1))))))))</calc>",
                            "</calc>",        "42",     "16",         "0",          "e",      "t0"};
    t.prepare = [](const google::protobuf::MethodDescriptor& m, google::protobuf::Message* req) {
      if (m.name() != "Step") return;
      auto* step = static_cast<rlmesh::StepRequest*>(req);
      if (!step->episode_id().empty() && step->episode_id() != "@fresh") return;
      rlmesh::ResetRequest reset;
      reset.mutable_task()->set_environment(step->turn() % 2 == 0 ? "calculator" : "arithmetic");
      reset.mutable_task()->set_reference_answer("6");
      auto episode = Table().Reset(reset);
      if (episode.ok()) step->set_episode_id(episode->episode_id());
    };
    t.check = Check;
    return new rlmesh::fuzz::RpcFuzzHarness(std::move(t));
  }();
  return *harness;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return Harness().Run(data, size); }
