#include "fuzz/replay_seed.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/testing/test_util.h"

namespace rlmesh::fuzz {

ReplayStore* SeededReplayStore() {
  static ReplayStore* store = [] {
    static const testing::TempDir dir;  // removed at exit
    ReplayStoreOptions o;
    o.db_path = dir.path();
    o.sync_writes = false;
    o.block_cache_bytes = 8 << 20;
    o.max_group_bytes = 1 << 20;
    o.ack_timeout = absl::Milliseconds(1);
    auto s = ReplayStore::Open(o);
    if (!s.ok()) std::abort();
    PutGroupsRequest seed;
    for (int g = 0; g < 4; ++g) {
      TrajectoryGroup* group = seed.add_groups();
      group->set_group_id("seed/" + std::to_string(g));
      group->set_experiment_id("seed");
      group->set_step(1 + g / 2);
      group->set_prompt_id("p" + std::to_string(g));
      for (int i = 0; i < 2; ++i) {
        Trajectory* t = group->add_samples();
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

std::string CheckSeed(ReplayStore& store) {
  QueryRequest q;
  q.mutable_filter()->set_experiment_id("seed");
  auto seeded = store.Query(q);
  if (!seeded.ok()) return absl::StrCat("Query of the seeded experiment: ", seeded.status().ToString());
  if (seeded->trajectories_size() != kSeedTrajectories) {
    return absl::StrCat("the seeded experiment holds ", seeded->trajectories_size(), " trajectories, not ",
                        kSeedTrajectories);
  }
  return "";
}

}  // namespace rlmesh::fuzz
