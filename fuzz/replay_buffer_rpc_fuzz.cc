// Every ReplayBuffer RPC, structure-aware (fuzz/rpc_fuzz.h), against the
// real service over loopback on the seeded store (fuzz/replay_seed.h).
// Requests that would write to or trim the seeded experiment are skipped;
// after each call the seeded experiment is still all there.
#include <cstdint>

#include "fuzz/replay_seed.h"
#include "fuzz/rpc_fuzz.h"
#include "proto/replay_buffer.pb.h"
#include "replay_buffer/service.h"

namespace {

bool TouchesSeed(const rlmesh::PutGroupsRequest& r) {
  for (const auto& g : r.groups()) {
    if (g.experiment_id() == "seed") return true;
    for (const auto& t : g.samples()) {
      if (t.experiment_id() == "seed") return true;
    }
  }
  return false;
}

rlmesh::fuzz::RpcFuzzHarness& Harness() {
  static rlmesh::fuzz::RpcFuzzHarness* harness = [] {
    static rlmesh::ServerAuth auth;
    rlmesh::ReplayServiceOptions options;
    options.writer_threads = 2;
    options.reader_threads = 2;
    options.sampler_threads = 2;
    options.max_sample_wait = absl::Milliseconds(100);
    static rlmesh::ReplayBufferService service(rlmesh::fuzz::SeededReplayStore(), &auth, options);
    rlmesh::fuzz::RpcFuzzTarget t;
    t.services = {&service};
    t.service_names = {"rlmesh.ReplayBuffer"};
    t.fill.known_strings = {"seed", "seed/0", "seed/1", "seed/0/1", "p0", "p3", "other", "learner-0"};
    t.allow = [](const google::protobuf::MethodDescriptor& m, const google::protobuf::Message& req) {
      if (m.name() == "PutGroups") return !TouchesSeed(static_cast<const rlmesh::PutGroupsRequest&>(req));
      if (m.name() == "Trim") return static_cast<const rlmesh::TrimRequest&>(req).experiment_id() != "seed";
      return true;
    };
    t.check = [](const std::string&) { return rlmesh::fuzz::CheckSeed(*rlmesh::fuzz::SeededReplayStore()); };
    return new rlmesh::fuzz::RpcFuzzHarness(std::move(t));
  }();
  return *harness;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return Harness().Run(data, size); }
