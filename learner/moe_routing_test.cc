// MoE routing replay end to end: a Qwen3-MoE-shaped
// policy's routes go from the rollout worker's trajectories through the
// replay buffer's store into the learner's RL step, which replays them; the
// MoE settings' refusals; the router's load-balancing loss on the learner
// path.
#include "learner/moe_routing.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "actor/checkpoint.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "learner/checkpoint.h"
#include "learner/testing/tiny_experiment.h"
#include "learner/trainer.h"
#include "replay_buffer/store.h"
#include "rollout/rollout_worker.h"
#include "rollout/testing/tiny_model.h"

namespace rlmesh::learner {
namespace {

// The rollout worker's groups for 4 prompts x 4 samples on `ckpt`, routes
// recorded when `record`; rewards 0/1 alternating (every group has variance).
std::vector<TrajectoryGroup> RolloutGroups(const std::string& ckpt, bool record) {
  rollout::RolloutWorker worker({}, std::make_unique<actor::CharTokenizer>());
  REQUIRE(worker.LoadCheckpoint(ckpt, 1).ok());
  GenerateRequest req = rollout::testing::MakeRequest({"1+2=", "3+4=", "5+1=", "2+2="}, 4, 6, 42);
  req.set_experiment_id("moe");
  req.set_record_routing(record);
  absl::Mutex mu;
  std::vector<TrajectoryGroup> groups;
  std::optional<absl::Status> done;
  auto handle = worker.Submit(
      req,
      [&](TrajectoryGroup g, bool) {
        absl::MutexLock lock(&mu);
        groups.push_back(std::move(g));
      },
      [&](absl::Status s) {
        absl::MutexLock lock(&mu);
        done = s;
      });
  REQUIRE(handle.ok());
  {
    absl::MutexLock lock(&mu);
    auto has = [&]() { return done.has_value(); };
    REQUIRE(mu.AwaitWithTimeout(absl::Condition(&has), absl::Seconds(120)));
    REQUIRE(done->ok());
  }
  std::sort(groups.begin(), groups.end(),
            [](const TrajectoryGroup& a, const TrajectoryGroup& b) { return a.group_id() < b.group_id(); });
  for (auto& g : groups) {
    for (int i = 0; i < g.samples_size(); ++i) g.mutable_samples(i)->set_reward(i % 2);
  }
  return groups;
}

// Stores the groups in a replay store at `db` and samples them back (FIFO).
std::vector<TrajectoryGroup> ThroughBuffer(const std::vector<TrajectoryGroup>& in, const std::string& db) {
  ReplayStoreOptions o;
  o.db_path = db;
  o.sync_writes = false;
  auto store = ReplayStore::Open(o);
  REQUIRE(store.ok());
  PutGroupsRequest put;
  for (const auto& g : in) *put.add_groups() = g;
  auto written = (*store)->PutGroups(put);
  INFO(written.status());
  REQUIRE(written.ok());
  CHECK(written->written() == static_cast<int>(in.size()));
  SampleGroupsRequest s;
  s.set_experiment_id("moe");
  s.set_consumer_id("learner");
  s.set_num_groups(static_cast<int>(in.size()));
  auto out = (*store)->SampleGroups(s, absl::Now() + absl::Seconds(30));
  REQUIRE(out.ok());
  std::vector<TrajectoryGroup> groups(out->groups().begin(), out->groups().end());
  std::sort(groups.begin(), groups.end(),
            [](const TrajectoryGroup& a, const TrajectoryGroup& b) { return a.group_id() < b.group_id(); });
  return groups;
}

ConfigureRequest MoeRequest(const std::string& ckpt, bool replay, std::optional<double> aux_coef = std::nullopt) {
  ExperimentConfig e = testing::TinyExperiment(7, 8);
  e.mutable_model()->set_init("checkpoint");
  e.mutable_model()->set_path(ckpt);
  Stage s;
  auto* rl = s.mutable_grpo()->mutable_rl();
  rl->set_steps(3);
  rl->set_prompts_per_step(4);
  rl->mutable_optimizer()->set_lr(1e-3);
  rl->set_routing_replay(replay);
  if (aux_coef) rl->set_router_aux_loss_coef(*aux_coef);
  *e.add_stages() = s;
  ConfigureRequest r;
  *r.mutable_experiment() = e;
  r.set_world_size(1);
  return r;
}

TrainStepRequest Step(const std::vector<TrajectoryGroup>& groups) {
  TrainStepRequest r;
  r.set_step(0);
  for (const auto& g : groups) *r.mutable_groups()->add_groups() = g;
  return r;
}

// One step of a fresh trainer; its metrics.
std::map<std::string, double> TrainOnce(const ConfigureRequest& cfg, const std::vector<TrajectoryGroup>& groups,
                                        Trainer* trainer = nullptr) {
  Trainer local;
  Trainer& t = trainer != nullptr ? *trainer : local;
  auto c = t.Configure(cfg);
  INFO(c.status());
  REQUIRE(c.ok());
  auto r = t.TrainStep(Step(groups));
  INFO(r.status());
  REQUIRE(r.ok());
  return {r->metrics().values().begin(), r->metrics().values().end()};
}

TEST_CASE("routes survive rollout -> protobuf -> replay buffer -> learner, which replays them exactly") {
  actor::ConfigureThreads(2);
  ::rlmesh::testing::TempDir dir;
  REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
  auto made = RolloutGroups(dir.File("moe"), true);
  REQUIRE(made.size() == 4);
  auto groups = ThroughBuffer(made, dir.File("db"));
  REQUIRE(groups.size() == made.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    REQUIRE(groups[g].samples_size() == made[g].samples_size());
    for (int i = 0; i < groups[g].samples_size(); ++i) {
      const Trajectory& t = groups[g].samples(i);
      CHECK(t.routes_size() == (t.prompt_token_ids_size() + t.response_token_ids_size() - 1) * 2 * 2);
      CHECK(std::equal(t.routes().begin(), t.routes().end(), made[g].samples(i).routes().begin(),
                       made[g].samples(i).routes().end()));
    }
  }

  // On the rollout's weights, replaying its experts gives its log-probs,
  // and the learner's router agrees with every replayed position.
  auto m = TrainOnce(MoeRequest(dir.File("moe"), true), groups);
  CHECK(m.at("behaviour_logp_abs_diff_max") <= 1e-6);
  CHECK(m.at("routing_replay_mismatch_frac") == 0.0);
  CHECK(m.at("ratio_mean") == 1.0);
  CHECK(m.at("router_aux_loss") > 0.0);

  // The learner really uses the carried routes: other experts (each id
  // shifted by one) change its log-probs, and the metric sees every
  // position disagree; with replay off the same routes are ignored.
  auto tampered = groups;
  for (auto& g : tampered) {
    for (auto& t : *g.mutable_samples()) {
      for (int j = 0; j < t.routes_size(); ++j) t.set_routes(j, (t.routes(j) + 1) % 6);
    }
  }
  auto bad = TrainOnce(MoeRequest(dir.File("moe"), true), tampered);
  CHECK(bad.at("behaviour_logp_abs_diff_max") > 1e-3);
  CHECK(bad.at("routing_replay_mismatch_frac") > 0.9);
  auto ignored = TrainOnce(MoeRequest(dir.File("moe"), false), tampered);
  CHECK(ignored.at("behaviour_logp_abs_diff_max") <= 1e-5);
  CHECK(ignored.count("routing_replay_mismatch_frac") == 0);
}

TEST_CASE("routing replay on a moved router: the mismatch with the learner's router is reported") {
  actor::ConfigureThreads(2);
  ::rlmesh::testing::TempDir dir;
  REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
  REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moved"), 3, /*router_noise=*/0.5).ok());
  auto groups = RolloutGroups(dir.File("moe"), true);
  // The learner's router moved since the rollout (as after updates).
  auto replayed = TrainOnce(MoeRequest(dir.File("moved"), true), groups);
  auto free = TrainOnce(MoeRequest(dir.File("moved"), false), groups);
  INFO("mismatch " << replayed.at("routing_replay_mismatch_frac") << ", |dlogp| replayed "
                   << replayed.at("behaviour_logp_abs_diff_max") << " free " << free.at("behaviour_logp_abs_diff_max"));
  CHECK(replayed.at("routing_replay_mismatch_frac") > 0.0);
  CHECK(replayed.at("routing_replay_mismatch_frac") < 1.0);
  // Both move the log-probs away from the rollout's (the gate values moved
  // either way); by how much depends on the model, so no order is claimed.
  CHECK(replayed.at("behaviour_logp_abs_diff_max") > 0.0);
  CHECK(free.count("routing_replay_mismatch_frac") == 0);
}

TEST_CASE("MoE settings are refused by name where they cannot apply") {
  actor::ConfigureThreads(2);
  ::rlmesh::testing::TempDir dir;
  REQUIRE(rollout::testing::WriteTinyCheckpoint(dir.File("dense"), 1).ok());
  REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
  {
    Trainer t;
    auto c = t.Configure(MoeRequest(dir.File("dense"), true));
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(c.status().message()),
               Catch::Contains("experiment.stages[0].grpo.rl.routing_replay: needs a policy with MoE layers"));
  }
  {
    Trainer t;
    auto c = t.Configure(MoeRequest(dir.File("dense"), false, 0.01));
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(std::string(c.status().message()), Catch::Contains("experiment.stages[0].grpo.rl.router_aux_loss_coef"));
  }
  {
    Trainer t;
    auto c = t.Configure(MoeRequest(dir.File("moe"), false, -1.0));
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(std::string(c.status().message()), Catch::Contains("router_aux_loss_coef: must be >= 0"));
  }
  // Replay on, but the trajectories carry no routes, or malformed ones.
  auto plain = RolloutGroups(dir.File("moe"), false);
  for (const auto& g : plain) {
    for (const auto& t : g.samples()) CHECK(t.routes_size() == 0);
  }
  Trainer t;
  REQUIRE(t.Configure(MoeRequest(dir.File("moe"), true)).ok());
  auto r = t.TrainStep(Step(plain));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(std::string(r.status().message()),
             Catch::Contains("groups[0].samples[0].routes: empty while rl.routing_replay is on"));
  auto recorded = RolloutGroups(dir.File("moe"), true);
  auto short_routes = recorded;
  short_routes[1].mutable_samples(2)->mutable_routes()->RemoveLast();
  r = t.TrainStep(Step(short_routes));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(std::string(r.status().message()), Catch::Contains("groups[1].samples[2].routes:"));
  auto out_of_range = recorded;
  out_of_range[0].mutable_samples(0)->set_routes(3, 6);
  r = t.TrainStep(Step(out_of_range));
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(std::string(r.status().message()), Catch::Contains("groups[0].samples[0].routes[3]: expert 6"));
  // The refusals left the trainer usable.
  CHECK(t.TrainStep(Step(recorded)).ok());
}

TEST_CASE("router aux loss on the learner path: its value, its weight, and config.json's default") {
  actor::ConfigureThreads(2);
  ::rlmesh::testing::TempDir dir;
  REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
  auto groups = RolloutGroups(dir.File("moe"), true);
  groups.resize(1);  // one micro-batch: the metric is that batch's loss

  // The reported value is LoadBalancingLoss over the batch's real tokens on
  // the step's starting weights.
  double want = 0;
  {
    auto model = actor::LoadHfModel(dir.File("moe"));
    REQUIRE(model.ok());
    const auto& samples = groups[0].samples();
    int64_t T = 0;
    for (const auto& s : samples) T = std::max<int64_t>(T, s.prompt_token_ids_size() + s.response_token_ids_size());
    const int64_t B = samples.size();
    auto ids = torch::zeros({B, T}, torch::kLong);
    auto real = torch::zeros({B, T}, torch::kFloat);
    for (int64_t b = 0; b < B; ++b) {
      int64_t j = 0;
      for (int id : samples[b].prompt_token_ids()) ids[b][j++] = id;
      for (int id : samples[b].response_token_ids()) ids[b][j++] = id;
      real[b].narrow(0, 0, j).fill_(1);
    }
    actor::MoeRouting rec;
    rec.record = true;
    (*model)->set_routing(&rec);
    torch::NoGradGuard g;
    (*model)->Forward(ids, torch::arange(T).unsqueeze(0).expand({B, T}).contiguous());
    (*model)->set_routing(nullptr);
    want = actor::LoadBalancingLoss(rec.router_logits, 6, 2, real.reshape({-1})).item<double>();
  }
  Trainer with, without, unset;
  auto m = TrainOnce(MoeRequest(dir.File("moe"), false, 0.5), groups, &with);
  CHECK(std::abs(m.at("router_aux_loss") - want) < 1e-6);
  TrainOnce(MoeRequest(dir.File("moe"), false, 0.0), groups, &without);
  TrainOnce(MoeRequest(dir.File("moe"), false), groups, &unset);
  // The coefficient reaches the update; unset is 0 when config.json has
  // output_router_logits false (what the checkpoint writer records).
  auto gate = [](Trainer& t) {
    for (auto& [name, p] : t.PolicyParameters()) {
      if (name == "model.layers.0.mlp.gate.weight") return p.clone();
    }
    FAIL("no router weight");
    return torch::Tensor();
  };
  CHECK_FALSE(torch::equal(gate(with), gate(without)));
  CHECK(torch::equal(gate(unset), gate(without)));

  // A config.json with output_router_logits: true makes its
  // router_aux_loss_coef the default, as transformers would train.
  {
    auto model = actor::LoadHfModel(dir.File("moe"));
    REQUIRE(model.ok());
    actor::ModelConfig c = (*model)->config();
    c.output_router_logits = true;
    c.router_aux_loss_coef = 0.25;
    actor::Transformer copy(c);
    torch::NoGradGuard g;
    auto src = (*model)->NamedParameters();
    auto dst = copy->NamedParameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
    REQUIRE(actor::SaveHfModel(copy, dir.File("moe_aux")).ok());
  }
  Trainer from_config, explicit_coef;
  TrainOnce(MoeRequest(dir.File("moe_aux"), false), groups, &from_config);
  TrainOnce(MoeRequest(dir.File("moe_aux"), false, 0.25), groups, &explicit_coef);
  CHECK(torch::equal(gate(from_config), gate(explicit_coef)));
  CHECK_FALSE(torch::equal(gate(from_config), gate(without)));
}

TEST_CASE("MoE policies pack their micro-batches: routes replayed where the packed rows hold them") {
  actor::ConfigureThreads(1);
  ::rlmesh::testing::TempDir dir;
  REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
  // Long-tailed lengths: sample i keeps 6, 4, 2 or 1 of its response
  // tokens (and their log-probs and routes), so packing saves slots.
  auto groups = RolloutGroups(dir.File("moe"), true);
  for (auto& g : groups) {
    for (int i = 0; i < g.samples_size(); ++i) {
      Trajectory* t = g.mutable_samples(i);
      const int positions = t->prompt_token_ids_size() + t->response_token_ids_size() - 1;
      REQUIRE(t->routes_size() % positions == 0);
      const int per_position = t->routes_size() / positions;  // MoE layers x k
      const int keep = std::min(t->response_token_ids_size(), std::vector<int>{6, 4, 2, 1}[i % 4]);
      t->mutable_response_token_ids()->Truncate(keep);
      if (t->loss_mask_size() > keep) t->mutable_loss_mask()->Truncate(keep);
      if (t->behaviour_logprobs_size() > keep) t->mutable_behaviour_logprobs()->Truncate(keep);
      t->mutable_routes()->Truncate((t->prompt_token_ids_size() + keep - 1) * per_position);
    }
  }
  for (bool replay : {true, false}) {
    INFO("routing_replay " << replay);
    TrainerOptions packed_opt, rows_opt;
    packed_opt.pack_rl = TrainerOptions::RlPacking::kOn;
    rows_opt.pack_rl = TrainerOptions::RlPacking::kOff;
    Trainer packed(packed_opt), rows(rows_opt);
    REQUIRE(packed.Configure(MoeRequest(dir.File("moe"), replay, 0.5)).ok());
    REQUIRE(rows.Configure(MoeRequest(dir.File("moe"), replay, 0.5)).ok());
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      TrainStepRequest req = Step(groups);
      req.set_step(step);
      auto p = packed.TrainStep(req);
      auto r = rows.TrainStep(req);
      REQUIRE(p.ok());
      REQUIRE(r.ok());
      const auto& mp = p->metrics().values();
      const auto& mr = r->metrics().values();
      CHECK(mp.at("packed_frac") == 1.0);
      CHECK(mr.at("packed_frac") == 0.0);
      CHECK(mp.at("pad_frac") < mr.at("pad_frac"));
      // Step 0 from equal weights: summation order only.
      const double tol = step == 0 ? 1e-6 : 1e-4;
      CHECK(mp.at("loss") == Approx(mr.at("loss")).margin(tol));
      CHECK(mp.at("router_aux_loss") == Approx(mr.at("router_aux_loss")).margin(tol));
      CHECK(mp.at("grad_norm") == Approx(mr.at("grad_norm")).epsilon(tol * 10));
      if (replay) {
        CHECK(mp.at("routing_replay_mismatch_frac") == mr.at("routing_replay_mismatch_frac"));
        // On the rollout's weights the replayed forward gives the rollout's
        // log-probs: a route placed at another token would not.
        if (step == 0) CHECK(mp.at("behaviour_logp_abs_diff_max") < 1e-4);
      }
    }
    CHECK(testing::MaxAbsDiff(packed, rows) < 1e-4);
    if (!replay) continue;
    // Expert parallelism runs the packed tokens through the experts'
    // exchange: two ranks equal one packed process. (The ranks split the
    // batch into other micro-batches, and the load-balancing loss is a
    // per-micro-batch statistic, so it is left out here.)
    const ConfigureRequest one = MoeRequest(dir.File("moe"), true, 0.0);
    ConfigureRequest ep = one;
    ep.mutable_experiment()->mutable_learner()->set_ep(2);
    auto step = [&](int i) {
      TrainStepRequest req = Step(groups);
      req.set_step(i);
      return req;
    };
    Trainer single(packed_opt);
    REQUIRE(single.Configure(one).ok());
    for (int i = 0; i < 3; ++i) REQUIRE(single.TrainStep(step(i)).ok());
    Trainer ranks[2] = {Trainer(packed_opt), Trainer(packed_opt)};
    auto results = testing::TrainShards(ranks, 2, ep, dir.File("store"), 3, step);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << results[r].ToString());
      REQUIRE(results[r].ok());
    }
    CHECK(testing::MaxAbsDiff(single, ranks[0]) <= 1e-5);
  }
}

ConfigureRequest WithCheckpointDir(ConfigureRequest r, const std::string& dir) {
  r.set_checkpoint_dir(dir);
  return r;
}

using testing::MaxAbsDiff;

TEST_CASE("learner.ep: 2 (one group, and 2 groups) equals one process on GRPO steps with routing replay; checkpoints resume across layouts") {
  actor::ConfigureThreads(1);
  ::rlmesh::testing::TempDir dir;
  REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
  // Five groups of four (the fifth a copy of the first under another id):
  // the ranks train 2 and 3 groups at ep=2, 1, 1, 1 and 2 at 2 x ep=2, so
  // they run different numbers of micro-batches and the short ones pad with
  // empty passes.
  std::vector<TrajectoryGroup> groups = RolloutGroups(dir.File("moe"), true);
  groups.push_back(groups[0]);
  groups.back().set_group_id(groups[0].group_id() + "-copy");
  auto step = [&](int i) {
    TrainStepRequest r = Step(groups);
    r.set_step(i);
    return r;
  };
  // Routing replay and the load-balancing loss (the router logits come
  // from the module the passes run through), a KL reference (whole on every
  // rank), small micro-batches.
  ConfigureRequest one = MoeRequest(dir.File("moe"), true, 0.01);
  one.mutable_experiment()->mutable_learner()->set_micro_batch_tokens(24);
  auto* rl = one.mutable_experiment()->mutable_stages(0)->mutable_grpo()->mutable_rl();
  rl->set_steps(5);
  rl->set_prompts_per_step(4);
  rl->mutable_kl()->set_coef(0.05);
  one.set_checkpoint_dir(dir.File("ckpt_one"));
  Trainer single, untrained;
  REQUIRE(single.Configure(one).ok());
  REQUIRE(untrained.Configure(one).ok());
  for (int i = 0; i < 3; ++i) REQUIRE(single.TrainStep(step(i)).ok());
  CHECK(MaxAbsDiff(single, untrained) > 1e-4);
  auto single_saved = single.Save();
  REQUIRE(single_saved.ok());

  ConfigureRequest ep = one;
  ep.mutable_experiment()->mutable_learner()->set_ep(2);
  ep.set_checkpoint_dir(dir.File("ckpt_ep"));
  Trainer ranks[2];
  std::string saved;
  auto results =
      testing::TrainShards(ranks, 2, ep, dir.File("store"), 3, step, testing::SaveKeepingRank0Path(&saved));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[r].ToString());
    REQUIRE(results[r].ok());
  }
  CHECK(MaxAbsDiff(single, ranks[0]) <= 1e-5);
  // Each rank's moments cover the replicated part and half of the experts.
  auto state = VerifyCheckpoint(saved);
  REQUIRE(state.ok());
  CHECK(state->ep == 2);
  const int64_t whole = testing::MomentsNumel(single_saved->path() + "/optimizer.safetensors");
  REQUIRE(whole > 0);
  const int64_t r0 = testing::MomentsNumel(saved + "/optimizer-rank-0.safetensors");
  const int64_t r1 = testing::MomentsNumel(saved + "/optimizer-rank-1.safetensors");
  CHECK(r0 == r1);
  CHECK(r0 < whole);
  CHECK(r0 + r1 > whole);

  // The EP checkpoint resumes in one process, and the plain one as ep=2:
  // the fourth step is single's either way.
  ConfigureRequest from_ep = one;
  from_ep.set_checkpoint_dir(dir.File("ckpt_ep"));
  Trainer plain;
  REQUIRE(plain.Configure(from_ep).ok());
  CHECK(plain.Status().step() == 3);
  Trainer again[2];
  auto resumed = testing::TrainShards(again, 2, WithCheckpointDir(ep, dir.File("ckpt_one")), dir.File("store2"), 1,
                                      [&](int) { return step(3); });
  for (int r = 0; r < 2; ++r) {
    INFO("resumed rank " << r << ": " << resumed[r].ToString());
    REQUIRE(resumed[r].ok());
  }
  REQUIRE(plain.TrainStep(step(3)).ok());
  // Two groups of ep=2 (expert data parallelism): four ranks; their
  // checkpoint resumes in one process too.
  ConfigureRequest two_groups = WithCheckpointDir(ep, dir.File("ckpt_ep2x2"));
  Trainer four[4];
  auto r4 = testing::TrainShards(four, 4, two_groups, dir.File("store4"), 3, step,
                                 [](int, Trainer& t) { return t.Save().status(); });
  for (int r = 0; r < 4; ++r) {
    INFO("2 groups, rank " << r << ": " << r4[r].ToString());
    REQUIRE(r4[r].ok());
  }
  CHECK(MaxAbsDiff(single, four[0]) <= 1e-5);
  Trainer from_groups;
  REQUIRE(from_groups.Configure(WithCheckpointDir(one, dir.File("ckpt_ep2x2"))).ok());
  REQUIRE(from_groups.TrainStep(step(3)).ok());

  REQUIRE(single.TrainStep(step(3)).ok());
  CHECK(MaxAbsDiff(single, plain) <= 1e-5);
  CHECK(MaxAbsDiff(single, again[0]) <= 1e-5);
  CHECK(MaxAbsDiff(single, from_groups) <= 1e-5);
}

// PPO's critic (the MoE policy's copy with a value head) stays whole on
// every rank, data-parallel over all of them, while the policy's experts
// are split: policy and critic after 2 steps equal one process's, and each
// layout's checkpoint resumes in one process with the critic's moments.
TEST_CASE("PPO under learner.ep: 2 (one group, and 2 groups): policy and critic equal one process's; checkpoints "
          "resume in one process") {
  actor::ConfigureThreads(1);
  ::rlmesh::testing::TempDir dir;
  REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
  const std::vector<TrajectoryGroup> groups = RolloutGroups(dir.File("moe"), false);
  ConfigureRequest one = MoeRequest(dir.File("moe"), false);
  {
    Stage ppo;
    *ppo.mutable_ppo()->mutable_rl() = one.experiment().stages(0).grpo().rl();
    ppo.mutable_ppo()->mutable_rl()->set_mini_batches(2);
    *one.mutable_experiment()->mutable_stages(0) = ppo;
  }
  // Micro-batches of a row or two: uneven passes over the ranks.
  one.mutable_experiment()->mutable_learner()->set_micro_batch_tokens(24);
  auto step = [&](int i) {
    TrainStepRequest q = Step(groups);
    q.set_step(i);
    return q;
  };
  Trainer single, untrained;
  REQUIRE(single.Configure(one).ok());
  REQUIRE(untrained.Configure(one).ok());
  for (int i = 0; i < 2; ++i) REQUIRE(single.TrainStep(step(i)).ok());
  auto two = single.Save(dir.File("plain_2"));
  REQUIRE(two.ok());
  REQUIRE(single.TrainStep(step(2)).ok());
  auto three = single.Save(dir.File("plain_3"));
  REQUIRE(three.ok());
  auto start = untrained.Save(dir.File("untrained"));
  REQUIRE(start.ok());
  // The steps move the critic, or equal critics would prove nothing.
  CHECK(testing::MaxAbsDiffOfFolders(two->path(), start->path(), "critic") > 1e-3);
  for (int world : {2, 4}) {
    INFO("ep=2 over " << world << " ranks");
    ConfigureRequest ep = one;
    ep.mutable_experiment()->mutable_learner()->set_ep(2);
    const std::string ckpt = dir.File(absl::StrCat("ckpt_ep_", world));
    Trainer ranks[4];
    std::string saved;
    auto results = testing::TrainShards(ranks, world, WithCheckpointDir(ep, ckpt),
                                        dir.File(absl::StrCat("store_", world)), 2, step,
                                        testing::SaveKeepingRank0Path(&saved));
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r << ": " << results[r].ToString());
      REQUIRE(results[r].ok());
    }
    Trainer after_two;
    REQUIRE(after_two.Configure(one).ok());
    REQUIRE(after_two.Load(two->path()).ok());
    CHECK(MaxAbsDiff(after_two, ranks[0]) <= 1e-5);
    CHECK(testing::MaxAbsDiffOfFolders(two->path(), saved, "critic") <= 1e-5);
    Trainer resumed;
    auto c = resumed.Configure(WithCheckpointDir(one, ckpt));
    INFO(c.status().ToString());
    REQUIRE(c.ok());
    REQUIRE(c->step() == 2);
    REQUIRE(resumed.TrainStep(step(2)).ok());
    auto resumed_saved = resumed.Save(dir.File(absl::StrCat("resumed_", world)));
    REQUIRE(resumed_saved.ok());
    CHECK(MaxAbsDiff(single, resumed) <= 1e-5);
    CHECK(testing::MaxAbsDiffOfFolders(three->path(), resumed_saved->path(), "critic") <= 1e-5);
  }
}

TEST_CASE("learner.ep is refused by name where it is not built") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(rollout::testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
  auto refusal = [&](ConfigureRequest r, int world) {
    r.set_world_size(world);
    r.set_store_address("file:/nonexistent/never-used");
    Trainer t;
    auto c = t.Configure(r);
    REQUIRE(!c.ok());
    return std::string(c.status().message());
  };
  ConfigureRequest r = MoeRequest(dir.File("moe"), false);
  r.mutable_experiment()->mutable_learner()->set_ep(2);
  CHECK(absl::StrContains(refusal(r, 3), "learner.ep: must divide learner.shards (3)"));
  ConfigureRequest tp = r;
  tp.mutable_experiment()->mutable_learner()->set_tp(2);
  CHECK(absl::StrContains(refusal(tp, 2), "learner.ep: expert parallelism with learner.tp > 1 or learner.zero: 1/3 is not built"));
  ConfigureRequest rm = r;  // a policy with a value head
  auto* stage = rm.mutable_experiment()->mutable_stages(0)->mutable_reward_model();
  stage->set_steps(1);
  stage->set_batch(2);
  stage->mutable_optimizer()->set_lr(1e-3);
  CHECK(absl::StrContains(refusal(rm, 2), "learner.ep > 1 is built for sft, dpo, grpo and ppo stages"));
  // A dense policy: both ranks form the group, then refuse by name.
  ConfigureRequest dense = r;
  dense.mutable_experiment()->mutable_model()->set_init("scratch");
  dense.mutable_experiment()->mutable_learner()->set_ep(2);
  Trainer ranks[2];
  auto results = testing::TrainShards(ranks, 2, dense, dir.File("store"), 0, [&](int i) { return Step({}); });
  for (int k = 0; k < 2; ++k) {
    INFO(results[k].ToString());
    CHECK(absl::StrContains(results[k].message(), "experiment.learner.ep"));
    CHECK(absl::StrContains(results[k].message(), "needs a policy with MoE layers"));
  }
}

}  // namespace
}  // namespace rlmesh::learner
