// The replay buffer's store behind every ReplayBuffer RPC: the first byte
// picks the call, the rest is its request as protobuf wire bytes (what a
// client can send). Any request gets a response or an error, never a crash,
// a hang or a broken store: after each call the store still answers Stats
// and a Query of the seeded experiment. One store for the whole run, in a
// temporary folder, seeded with a small experiment so Query, Sample, Ack,
// Trim and Export reach real data.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/time/clock.h"
#include "replay_buffer/store.h"

namespace {

rlmesh::ReplayStore* Store() {
  static rlmesh::ReplayStore* store = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    static std::string dir = std::string(base != nullptr ? base : "/tmp") + "/rlmesh-replay-fuzz-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) std::abort();
    std::atexit([] { std::filesystem::remove_all(dir); });
    rlmesh::ReplayStoreOptions o;
    o.db_path = dir;
    o.sync_writes = false;
    o.block_cache_bytes = 8 << 20;
    o.max_group_bytes = 1 << 20;
    o.ack_timeout = absl::Milliseconds(1);
    auto s = rlmesh::ReplayStore::Open(o);
    if (!s.ok()) std::abort();
    rlmesh::PutGroupsRequest seed;
    for (int g = 0; g < 4; ++g) {
      rlmesh::TrajectoryGroup* group = seed.add_groups();
      group->set_group_id("seed/" + std::to_string(g));
      group->set_experiment_id("seed");
      group->set_step(1 + g / 2);
      group->set_prompt_id("p" + std::to_string(g));
      for (int i = 0; i < 2; ++i) {
        rlmesh::Trajectory* t = group->add_samples();
        t->set_trajectory_id(group->group_id() + "/" + std::to_string(i));
        t->set_experiment_id("seed");
        t->set_step(group->step());
        t->set_group_id(group->group_id());
        t->set_prompt_id(group->prompt_id());
        t->set_sample_index(i);
        t->add_prompt_token_ids(3);
        t->add_response_token_ids(4 + i);
        t->add_loss_mask(1);
        t->add_behaviour_logprobs(-0.5f);
        t->set_reward(i);
        t->set_policy_version(1);
        t->set_response_text(i ? "7" : "8");
      }
    }
    if (!(*s)->PutGroups(seed).ok()) std::abort();
    return s->release();
  }();
  return store;
}

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request* r) {
  return r->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > (1 << 16)) return 0;
  rlmesh::ReplayStore* store = Store();
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
  rlmesh::QueryRequest q;
  q.mutable_filter()->set_experiment_id("seed");
  auto seeded = store->Query(q);
  if (!seeded.ok() || seeded->trajectories_size() != 8) std::abort();
  return 0;
}
