// The replay buffer's store behind every ReplayBuffer RPC: the first byte
// picks the call, the rest is its request as protobuf wire bytes (what a
// client can send). Any request gets a response or an error, never a crash,
// a hang or a broken store: after each call the seeded experiment
// (fuzz/replay_seed.h) is still all there.
#include <cstdint>
#include <string>

#include "absl/time/clock.h"
#include "fuzz/replay_seed.h"
#include "replay_buffer/store.h"

namespace {

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request* r) {
  return r->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 16)) return 0;
  rlmesh::ReplayStore* store = rlmesh::fuzz::SeededReplayStore();
  const uint8_t op = data[0] % 7;
  ++data;
  --size;
  switch (op) {
    case 0: {
      rlmesh::PutGroupsRequest r;
      if (!Parse(data, size, &r)) break;
      bool touches_seed = false;
      for (const auto& g : r.groups()) touches_seed |= g.experiment_id() == "seed";
      for (const auto& g : r.groups()) {
        for (const auto& t : g.samples()) touches_seed |= t.experiment_id() == "seed";
      }
      if (!touches_seed) (void)store->PutGroups(r);
      break;
    }
    case 1: {
      rlmesh::QueryRequest r;
      if (Parse(data, size, &r)) (void)store->Query(r);
      break;
    }
    case 2: {
      rlmesh::SampleGroupsRequest r;
      // Never wait: the deadline is now.
      if (Parse(data, size, &r)) (void)store->SampleGroups(r, absl::Now(), [] { return false; });
      break;
    }
    case 3: {
      rlmesh::AckSampleRequest r;
      if (Parse(data, size, &r)) (void)store->AckSample(r);
      break;
    }
    case 4: {
      rlmesh::TrimRequest r;
      // The seeded experiment stays: the checks below read it.
      if (Parse(data, size, &r) && r.experiment_id() != "seed") (void)store->Trim(r);
      break;
    }
    case 5: {
      rlmesh::StatsRequest r;
      if (Parse(data, size, &r)) (void)store->Stats(r);
      break;
    }
    default: {
      rlmesh::ExportRequest r;
      if (Parse(data, size, &r)) {
        (void)store->Export(r, [](rlmesh::ExportChunk&) { return true; });
      }
      break;
    }
  }
  // The store still works.
  if (!rlmesh::fuzz::CheckSeed(*store).empty()) std::abort();
  return 0;
}
