#pragma once

// Helpers shared by the ReplayStore tests: groups, requests and a store in
// a test's temp directory.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "replay_buffer/store.h"

namespace rlmesh::replay_testing {

// A group of `rewards.size()` samples; sample j has a response of 2 + j
// tokens and finish reason STOP (LENGTH for odd j).
inline TrajectoryGroup MakeGroup(const std::string& exp, int64_t step, const std::string& gid,
                                 std::vector<double> rewards, int64_t version = 1,
                                 const std::string& prompt = "") {
  TrajectoryGroup g;
  g.set_experiment_id(exp);
  g.set_step(step);
  g.set_group_id(gid);
  g.set_prompt_id(prompt.empty() ? "p-" + gid : prompt);
  for (size_t j = 0; j < rewards.size(); ++j) {
    Trajectory* t = g.add_samples();
    t->set_trajectory_id(absl::StrCat(exp, "/", step, "/", gid, "/", j));
    t->set_sample_index(j);
    t->set_policy_version(version);
    t->set_reward(rewards[j]);
    t->set_finish_reason(j % 2 ? FINISH_REASON_LENGTH : FINISH_REASON_STOP);
    t->add_prompt_token_ids(7);
    t->add_prompt_token_ids(8);
    for (size_t k = 0; k < 2 + j; ++k) {
      t->add_response_token_ids(100 + k);
      t->add_loss_mask(1);
      t->add_behaviour_logprobs(-0.5f);
    }
    t->set_response_text(absl::StrCat("answer ", gid, " #", j));
  }
  return g;
}

inline PutGroupsRequest Req(std::vector<TrajectoryGroup> groups) {
  PutGroupsRequest r;
  for (auto& g : groups) *r.add_groups() = std::move(g);
  return r;
}

inline std::unique_ptr<ReplayStore> OpenStore(const std::string& path,
                                              ReplayStoreOptions options = {}) {
  options.db_path = path;
  auto store = ReplayStore::Open(options);
  REQUIRE(store.ok());
  return *std::move(store);
}

inline absl::Time Soon(int ms = 2000) { return absl::Now() + absl::Milliseconds(ms); }

inline SampleGroupsRequest Fifo(const std::string& exp, const std::string& consumer, int n,
                                bool ack = false) {
  SampleGroupsRequest r;
  r.set_experiment_id(exp);
  r.set_consumer_id(consumer);
  r.set_mode(SAMPLE_FIFO);
  r.set_num_groups(n);
  r.set_require_ack(ack);
  return r;
}

inline std::vector<std::string> GroupIds(const SampleGroupsResponse& r) {
  std::vector<std::string> ids;
  for (const auto& g : r.groups()) ids.push_back(g.group_id());
  return ids;
}

inline QueryRequest Q(const std::string& exp, int limit = 0) {
  QueryRequest q;
  q.mutable_filter()->set_experiment_id(exp);
  q.set_limit(limit);
  return q;
}

}  // namespace rlmesh::replay_testing
