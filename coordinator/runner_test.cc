// The experiment loop against fake roles (testing/fake_roles.h): no
// processes, no network. Each case pins one behaviour of the loop that the
// e2e tests only reach through real training runs.

#include "coordinator/runner.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "catch2/catch.hpp"
#include "common/proto_yaml.h"
#include "common/testing/test_util.h"
#include "coordinator/experiment_config.h"
#include "coordinator/testing/fake_roles.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

using testing::FakeCluster;

// A small arithmetic experiment; `stages` is the YAML list of stages.
ExperimentConfig Config(const std::string& stages, const std::string& extra = "") {
  ExperimentConfig cfg;
  YamlSource src;
  const std::string yaml =
      "name: t\nseed: 7\nmodel: {tokenizer: char}\n"
      "task: {kind: arithmetic, digits: 1, train: 64, eval: 8}\n"
      "stages:\n" +
      stages +
      "rollout: {workers: 1, sampling: {temperature: 1.0, max_new_tokens: 3}}\n"
      "learner: {shards: 1}\n" +
      extra;
  absl::Status s = MergeYaml(yaml, &cfg, &src);
  if (s.ok()) s = NormalizeExperiment(&cfg, src);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return cfg;
}

const char kGrpo[] =
    "  - grpo: {rl: {steps: 3, prompts_per_step: 2, samples_per_prompt: 2, optimizer: {lr: 1.0e-4}}}\n";

RunnerOptions Options(const ExperimentConfig& cfg, const std::string& run_dir, int learners = 1) {
  RunnerOptions o;
  o.experiment = cfg;
  o.experiment.mutable_learner()->set_shards(learners);
  o.experiment_id = "exp";
  o.run_dir = run_dir;
  // Never dialled: the fakes stand in for them.
  o.replay_buffer = "fake:1";
  o.reward_servers = {"fake:2"};
  o.rollout_workers = {"fake:3"};
  o.learners.assign(learners, "fake:4");
  o.progress = false;
  return o;
}

// The events that show the loop's order, publish/configure noise dropped.
std::vector<std::string> Order(const std::vector<std::string>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    if (e.rfind("learner.PublishWeights", 0) == 0 || e.rfind("rollout.ConfigureWeightSync", 0) == 0) continue;
    out.push_back(e);
  }
  return out;
}

std::vector<nlohmann::json> Records(const std::string& run_dir, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["event"] == event) out.push_back(j);
  }
  return out;
}

// Every version the workers were asked to load, in order.
std::vector<int64_t> LoadedVersions(const FakeCluster& c) {
  std::vector<int64_t> v;
  for (const auto& l : c.loads()) v.push_back(l.version);
  return v;
}

TEST_CASE("sync RL: every step generates, trains, publishes weights, then evaluates") {
  testing::TempDir dir;
  FakeCluster cluster({});
  ExperimentRunner runner(Options(Config(kGrpo, "eval: {every: 1}\n"), dir.path()), cluster.MakeClients());
  REQUIRE(runner.Run().ok());
  const std::vector<std::string> want = {
      "learner.Configure stage=0 step=0",
      // A stage starts from a folder, then the held-out eval before it.
      "learner.Save folder", "rollout.LoadWeights folder v=1", "rollout.Generate eval", "reward.Score",
      // Step 1: generate (pipeline) -> train -> weights -> eval.
      "rollout.Generate pipeline", "learner.TrainStep", "rollout.LoadWeights sync v=2", "rollout.Generate eval",
      "reward.Score",
      // Step 2.
      "rollout.Generate pipeline", "learner.TrainStep", "rollout.LoadWeights sync v=3", "rollout.Generate eval",
      "reward.Score",
      // Step 3 is the last: no periodic eval; the stage's checkpoint and
      // final eval follow.
      "rollout.Generate pipeline", "learner.TrainStep", "rollout.LoadWeights sync v=4", "learner.Save checkpoint",
      "rollout.Generate eval", "reward.Score"};
  CHECK(Order(cluster.events()) == want);
  // One publish per synced step, and the learner trains on groups of the
  // version it just published: synchronous means zero lag.
  const auto events = cluster.events();
  CHECK(std::count(events.begin(), events.end(), "learner.PublishWeights") == 3);
  // Each publish runs alongside the workers' load (one collective): after
  // the step's TrainStep, before the eval or next step generates.
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i] != "learner.PublishWeights") continue;
    INFO("event " << i);
    const auto before = std::find_if(events.rbegin() + (events.size() - i), events.rend(), [](const std::string& e) {
      return e.rfind("learner.TrainStep", 0) == 0 || e.rfind("rollout.Generate", 0) == 0;
    });
    REQUIRE(before != events.rend());
    CHECK(*before == "learner.TrainStep");
    const auto after = std::find_if(events.begin() + i, events.end(), [](const std::string& e) {
      return e.rfind("learner.TrainStep", 0) == 0 || e.rfind("rollout.Generate", 0) == 0;
    });
    REQUIRE(after != events.end());
    CHECK(after->rfind("rollout.Generate", 0) == 0);
  }
  const auto trains = cluster.trains();
  REQUIRE(trains.size() == 3);
  for (size_t i = 0; i < trains.size(); ++i) {
    INFO("step " << i);
    CHECK(trains[i].step == static_cast<int64_t>(i));
    CHECK(trains[i].group_versions == std::vector<int64_t>{static_cast<int64_t>(i + 1), static_cast<int64_t>(i + 1)});
    CHECK(trains[i].groups_round == static_cast<int64_t>(i + 1));
  }
  CHECK(runner.status().state() == "SUCCEEDED");
  CHECK(runner.status().metrics().count("recoveries") == 0);
}

// Runs an async stage with max_staleness `k`; returns each step's lag (the
// workers' version when it trained minus the version its groups came from).
std::vector<int64_t> AsyncLags(int k, FakeCluster* cluster, const std::string& run_dir) {
  const std::string stage =
      "  - grpo: {rl: {steps: 8, prompts_per_step: 2, samples_per_prompt: 2, max_staleness: " + std::to_string(k) +
      ", optimizer: {lr: 1.0e-4}}}\n";
  ExperimentRunner runner(Options(Config(stage), run_dir), cluster->MakeClients());
  absl::Status s = runner.Run();
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(runner.status().metrics().count("recoveries") == 0);
  CHECK(cluster->stale_skipped() == 0);
  std::vector<int64_t> lags;
  for (const auto& t : cluster->trains()) {
    REQUIRE(t.group_versions.size() == 2);
    // The learner's bound is (workers' version now) - k.
    const int64_t now = t.min_policy_version + k;
    for (int64_t v : t.group_versions) CHECK(v >= t.min_policy_version);
    lags.push_back(now - *std::min_element(t.group_versions.begin(), t.group_versions.end()));
  }
  REQUIRE(lags.size() == 8);
  return lags;
}

// A model folder that names no stop token would generate to
// max_new_tokens every time: the run is refused before anything starts,
// naming what it read; the experiment's own stop ids are enough.
TEST_CASE("a tokenizer folder without a stop token is refused, naming the files read") {
  testing::TempDir dir;
  const std::string folder = dir.File("tok");
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"1": 0, "+": 1, "=": 2, "2": 3}, "merges": []},
            "added_tokens": [{"id": 4, "content": "</s>", "special": true}]})";
  std::ofstream(folder + "/tokenizer_config.json") << R"({"bos_token": null})";
  ExperimentConfig cfg = Config(kGrpo);
  cfg.mutable_model()->set_tokenizer(folder);
  {
    FakeCluster cluster({});
    ExperimentRunner runner(Options(cfg, dir.File("a")), cluster.MakeClients());
    absl::Status s = runner.Run();
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(s.message()).find("no stop token: read " + folder + "/tokenizer_config.json (no eos_token); " +
                                        folder + "/generation_config.json (absent)") != std::string::npos);
    CHECK(cluster.events().empty());
  }
  cfg.mutable_rollout()->mutable_sampling()->add_stop_token_ids(4);
  FakeCluster cluster({});
  ExperimentRunner runner(Options(cfg, dir.File("b")), cluster.MakeClients());
  CHECK(runner.Run().ok());
}

// A backend that cannot run here fails the run by name, unless the
// experiment asked for checkpoint folders instead; the step metrics say
// which way the weights went.
TEST_CASE("weight sync: an unavailable backend is refused, or replaced by checkpoint folders only when asked") {
  testing::TempDir dir;
  {
    FakeCluster cluster({});
    cluster.FailNext("rollout.ConfigureWeightSync", absl::UnimplementedError("no NCCL in this build"));
    ExperimentRunner runner(Options(Config(kGrpo, "weight_sync: {backend: WEIGHT_SYNC_NCCL}\n"), dir.File("a")),
                            cluster.MakeClients());
    absl::Status s = runner.Run();
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("weight_sync.backend nccl cannot run here: no NCCL in this build") !=
          std::string::npos);
    CHECK(std::string(s.message()).find("weight_sync.fallback: checkpoint") != std::string::npos);
  }
  {
    FakeCluster cluster({});
    cluster.FailNext("rollout.ConfigureWeightSync", absl::UnimplementedError("no NCCL in this build"));
    ExperimentRunner runner(
        Options(Config(kGrpo, "weight_sync: {backend: WEIGHT_SYNC_NCCL, fallback: checkpoint}\n"), dir.File("b")),
        cluster.MakeClients());
    absl::Status s = runner.Run();
    INFO(s.ToString());
    REQUIRE(s.ok());
    const auto steps = Records(dir.File("b"), "step");
    REQUIRE(steps.size() == 3);
    for (const auto& j : steps) CHECK(j["weight_sync"] == "checkpoint");
    int from_folder = 0;
    for (const auto& l : cluster.loads()) from_folder += l.from_checkpoint ? 1 : 0;
    CHECK(from_folder == 4);  // the stage's start and each of the three steps
  }
  {
    FakeCluster cluster({});
    ExperimentRunner runner(Options(Config(kGrpo), dir.File("c")), cluster.MakeClients());
    REQUIRE(runner.Run().ok());
    for (const auto& j : Records(dir.File("c"), "step")) {
      CHECK(j["weight_sync"] == "auto");
      CHECK_FALSE(j.contains("cuda_graph_replays"));
    }
  }
}

// With rollout.cuda_graphs each step says how many graphs its generation
// replayed (the change in the workers' totals, not the totals).
TEST_CASE("rollout.cuda_graphs: each step records the graphs its generation captured and replayed") {
  testing::TempDir dir;
  ExperimentConfig cfg = Config(kGrpo);
  cfg.mutable_model()->set_device("cuda");
  cfg.mutable_rollout()->set_cuda_graphs(true);
  FakeCluster cluster({});
  ExperimentRunner runner(Options(cfg, dir.File("a")), cluster.MakeClients());
  absl::Status s = runner.Run();
  INFO(s.ToString());
  REQUIRE(s.ok());
  const auto steps = Records(dir.File("a"), "step");
  REQUIRE(steps.size() == 3);
  for (size_t i = 0; i < steps.size(); ++i) {
    INFO("step " << i);
    CHECK(steps[i]["cuda_graph_replays"] == 10.0);
    CHECK(steps[i]["cuda_graph_captures"] == (i == 0 ? 1.0 : 0.0));
  }
}

// The learner sends what the workers hold (a bf16 rollout gets bf16 from the
// fp32 masters); workers that disagree, or a rollout.dtype the workers do not
// hold, fail the run by name at the first sync.
TEST_CASE("weight sync carries the rollout workers' dtype; a disagreement is refused by name") {
  testing::TempDir dir;
  FakeCluster::Options two;
  two.rollouts = 2;
  auto options = [&](const std::string& run, const std::string& dtype) {
    ExperimentConfig cfg = Config(kGrpo);
    cfg.mutable_rollout()->set_workers(2);
    cfg.mutable_rollout()->set_dtype(dtype);
    RunnerOptions o = Options(cfg, dir.File(run));
    o.rollout_workers = {"fake:3", "fake:5"};
    return o;
  };
  {
    FakeCluster cluster(two);
    cluster.SetRolloutDtype(0, "bf16");
    cluster.SetRolloutDtype(1, "bf16");
    ExperimentRunner runner(options("a", "bf16"), cluster.MakeClients());
    absl::Status s = runner.Run();
    INFO(s.ToString());
    REQUIRE(s.ok());
    const std::vector<std::string> sent = cluster.published_dtypes();
    CHECK(sent.size() == 3);  // each of the three steps
    for (const std::string& d : sent) CHECK(d == "bf16");
  }
  {
    FakeCluster cluster(two);
    cluster.SetRolloutDtype(1, "bf16");
    ExperimentRunner runner(options("b", ""), cluster.MakeClients());
    absl::Status s = runner.Run();
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("different dtypes (f32 and bf16 on worker 1)") != std::string::npos);
    CHECK(cluster.published_dtypes().empty());
  }
  {
    FakeCluster cluster(two);
    ExperimentRunner runner(options("c", "bf16"), cluster.MakeClients());
    absl::Status s = runner.Run();
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("rollout.dtype: bf16, but the rollout workers hold f32") != std::string::npos);
  }
}

TEST_CASE("async RL: rollout runs ahead of the learner, never more than max_staleness versions") {
  for (int k : {1, 2}) {
    INFO("max_staleness " << k);
    testing::TempDir dir;
    // Train step s waits for the producer to make every round the bound
    // allows while it trains (rounds up to s + 1 + k of 8), so the producer
    // goes as far ahead as allowed on any machine; a bound that let it go
    // less far makes the wait time out and the "did run ahead" check fail.
    FakeCluster::Options o;
    o.train_waits_for_generations = [k](int64_t s) { return std::min<int64_t>(s + 1 + k, 8); };
    FakeCluster cluster(o);
    const std::vector<int64_t> lags = AsyncLags(k, &cluster, dir.path());
    CHECK(*std::max_element(lags.begin(), lags.end()) == k);  // it did run ahead
    for (int64_t lag : lags) CHECK(lag <= k);                 // and no further
    CHECK(lags[0] == 0);                                      // the first step is generated on the stage's weights
    // The metrics record the lag of the version the producer asked for, which
    // the workers may have moved past by the time they generated.
    const auto steps = Records(dir.path(), "step");
    REQUIRE(steps.size() == 8);
    for (size_t i = 0; i < steps.size(); ++i) {
      CHECK(steps[i]["rollout_lag_versions"].get<double>() >= lags[i]);
      CHECK(steps[i]["rollout_lag_versions"].get<double>() <= k);
    }
    // Rounds are generated in order (FIFO order is step order).
    std::vector<int64_t> rounds;
    for (const auto& g : cluster.generations()) {
      if (g.pipeline) rounds.push_back(g.round);
    }
    CHECK(rounds == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  }
}

// "train/<k>" -> k.
int PromptNumber(const std::string& id) { return std::stoi(id.substr(id.rfind('/') + 1)); }

TEST_CASE("dynamic sampling refill: generate fresh prompts until prompts_per_step groups vary, sync and async") {
  for (int k : {0, 1}) {
    for (bool never : {false, true}) {
      INFO("max_staleness " << k << (never ? ", no group ever varies" : ""));
      testing::TempDir dir;
      FakeCluster::Options o;
      // A group (2 samples) varies when sample 0 is right and 1 is not: for
      // a third of the prompts.
      o.right = [never](const std::string& id, int sample) {
        return !never && sample == 0 && PromptNumber(id) % 3 == 0;
      };
      FakeCluster cluster(o);
      const std::string stage =
          "  - grpo: {rl: {steps: 4, prompts_per_step: 2, samples_per_prompt: 2, max_staleness: " +
          std::to_string(k) + ", dynamic_sampling: {mode: refill, max_rounds: 3}, optimizer: {lr: 1.0e-4}}}\n";
      ExperimentRunner runner(Options(Config(stage), dir.path()), cluster.MakeClients());
      absl::Status s = runner.Run();
      INFO(s.ToString());
      REQUIRE(s.ok());
      // Each step's pipeline generations, by round.
      std::map<int64_t, std::vector<FakeCluster::Generation>> by_round;
      for (const auto& g : cluster.generations()) {
        if (g.pipeline) by_round[g.round].push_back(g);
      }
      REQUIRE(by_round.size() == 4);
      const auto steps = Records(dir.path(), "step");
      REQUIRE(steps.size() == 4);
      const auto trains = cluster.trains();
      REQUIRE(trains.size() == 4);
      int step = 0;
      int refilled_steps = 0;
      for (const auto& [round, gens] : by_round) {
        INFO("step " << step);
        std::set<std::string> ids;
        int generated = 0, informative = 0;
        for (const auto& g : gens) {
          for (const auto& id : g.prompt_ids) {
            CHECK(ids.insert(id).second);  // no prompt twice in a step
            ++generated;
            if (!never && PromptNumber(id) % 3 == 0) ++informative;
          }
        }
        const int rounds = static_cast<int>(gens.size()) - 1;
        refilled_steps += rounds > 0 ? 1 : 0;
        // It stops as soon as 2 groups vary, or after 3 extra rounds.
        CHECK(rounds <= 3);
        CHECK(((informative >= 2) || (rounds == 3)));
        const nlohmann::json& j = steps[step];
        CHECK(j["dynamic_sampling_groups_generated"].get<double>() == generated);
        CHECK(j["dynamic_sampling_groups_informative"].get<double>() == informative);
        CHECK(j["dynamic_sampling_refill_rounds"].get<double>() == rounds);
        // The learner took every group the step generated, and only those.
        CHECK(static_cast<int>(trains[step].group_versions.size()) == generated);
        CHECK(trains[step].groups_round == round);
        ++step;
      }
      // With a third of the prompts informative, 2 prompts rarely suffice.
      CHECK(refilled_steps > 0);
      if (never) {
        for (const auto& j : steps) CHECK(j["dynamic_sampling_refill_rounds"].get<double>() == 3);
      }
      CHECK(cluster.stale_skipped() == 0);
    }
  }
}

TEST_CASE("worker versions keep increasing across stages, each stage starting from a folder") {
  testing::TempDir dir;
  FakeCluster cluster({});
  const std::string stages =
      "  - sft: {steps: 3, batch: 4, optimizer: {lr: 1.0e-3}}\n"
      "  - grpo: {rl: {steps: 2, prompts_per_step: 2, samples_per_prompt: 2, optimizer: {lr: 1.0e-4}}}\n";
  ExperimentRunner runner(Options(Config(stages), dir.path()), cluster.MakeClients());
  REQUIRE(runner.Run().ok());
  // Each stage's learner counts from 0; the offset keeps the workers going up:
  // SFT: folder 1, steps 2..4; GRPO: folder 5, steps 6..7.
  CHECK(LoadedVersions(cluster) == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7});
  const auto loads = cluster.loads();
  CHECK(loads[0].from_checkpoint);
  CHECK(loads[4].from_checkpoint);
  CHECK_FALSE(loads[5].from_checkpoint);
  // The GRPO learner (version 0 after Configure) asks for groups of the
  // workers' numbering, not its own.
  const auto trains = cluster.trains();
  REQUIRE(trains.size() == 5);
  CHECK(trains[3].min_policy_version == 5);
  CHECK(trains[3].group_versions == std::vector<int64_t>{5, 5});
  const auto summary = runner.summary();
  REQUIRE(summary.accuracy.size() == 3);
  CHECK(summary.accuracy[0].first == "init");
  CHECK(summary.accuracy[1].first == "sft");
  CHECK(summary.accuracy[2].first == "grpo");
}

TEST_CASE("recovery: a learner that dies is reconfigured from its checkpoint, workers reloaded, step retried") {
  testing::TempDir dir;
  FakeCluster cluster({});
  cluster.CrashLearnerAt(0, 3);  // after the checkpoint at step 2
  const std::string stage =
      "  - grpo: {rl: {steps: 4, prompts_per_step: 2, samples_per_prompt: 2, optimizer: {lr: 1.0e-4}}}\n";
  ExperimentRunner runner(Options(Config(stage, "checkpoint: {every: 2}\n"), dir.path()), cluster.MakeClients());
  absl::Status s = runner.Run();
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(runner.status().metrics().at("recoveries") == 1);
  // Steps 0..2, the crash at 3, then from the checkpoint (2) again.
  std::vector<int64_t> steps;
  for (const auto& t : cluster.trains()) steps.push_back(t.step);
  CHECK(steps == std::vector<int64_t>{0, 1, 2, 2, 3});
  const auto events = cluster.events();
  // Every role was waited for (replay buffer, reward, rollout, learner).
  CHECK(std::count_if(events.begin(), events.end(),
                      [](const std::string& e) { return e.rfind("health.Wait", 0) == 0; }) == 4);
  CHECK(std::find(events.begin(), events.end(), "learner.Configure stage=0 step=2") != events.end());
  // The workers never saw a version twice or go back, though the learner did.
  const std::vector<int64_t> v = LoadedVersions(cluster);
  CHECK(std::adjacent_find(v.begin(), v.end(), std::greater_equal<int64_t>()) == v.end());
  // After recovery the workers reload from a folder, above what they held.
  const auto loads = cluster.loads();
  const auto reload = std::find_if(loads.begin() + 1, loads.end(), [](const auto& l) { return l.from_checkpoint; });
  REQUIRE(reload != loads.end());
  CHECK(reload->version == 5);  // held 4 (folder 1 + steps 1..3)
}

TEST_CASE("rollout.sleep: workers sleep between each step's generation and training; its sync wakes them") {
  for (const std::string mode : {"cache", "weights"}) {
    INFO("rollout.sleep " << mode);
    testing::TempDir dir;
    FakeCluster cluster({});
    // A learner that dies after the workers slept: recovery must load
    // weights into them before the retried step generates (the fake refuses
    // Generate while its weights are released).
    cluster.CrashLearnerAt(0, 3);
    const std::string stage =
        "  - grpo: {rl: {steps: 4, prompts_per_step: 2, samples_per_prompt: 2, optimizer: {lr: 1.0e-4}}}\n";
    ExperimentConfig cfg = Config(stage, "checkpoint: {every: 2}\neval: {every: 1}\n");
    cfg.mutable_rollout()->set_sleep(mode);
    ExperimentRunner runner(Options(cfg, dir.path()), cluster.MakeClients());
    absl::Status s = runner.Run();
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(runner.status().metrics().at("recoveries") == 1);
    // Each step's generation is followed by the sleep and then the train.
    const std::vector<std::string> order = Order(cluster.events());
    int sleeps = 0, generations = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i] == "rollout.Generate pipeline") {
        ++generations;
        REQUIRE(i + 2 < order.size());
        CHECK(order[i + 1] == "rollout.Sleep " + mode);
        CHECK(order[i + 2] == "learner.TrainStep");
      }
      if (order[i].rfind("rollout.Sleep", 0) == 0) ++sleeps;
    }
    // Steps 0..3, then 2 and 3 again from the checkpoint at step 2.
    CHECK(generations == 6);
    CHECK(sleeps == generations);
    const auto steps = Records(dir.path(), "step");
    REQUIRE(steps.size() >= 4);
    for (const auto& j : steps) {
      CHECK(j.at("rollout_sleep_released_bytes").get<double>() == (mode == "weights" ? 1000 : 0));
      CHECK(j.at("rollout_sleep_memory_after_bytes").get<double>() <=
            j.at("rollout_sleep_memory_before_bytes").get<double>());
      CHECK(j.contains("seconds_sleep"));
    }
  }
  // Off (the default): no Sleep at all.
  testing::TempDir dir;
  FakeCluster cluster({});
  ExperimentRunner runner(Options(Config(kGrpo), dir.path()), cluster.MakeClients());
  REQUIRE(runner.Run().ok());
  for (const auto& e : cluster.events()) CHECK(e.rfind("rollout.Sleep", 0) != 0);
}

TEST_CASE("recovery gives up after three tries, and never for an error a restart does not explain") {
  const std::string stage =
      "  - grpo: {rl: {steps: 2, prompts_per_step: 2, samples_per_prompt: 2, optimizer: {lr: 1.0e-4}}}\n";
  auto count = [](const std::vector<std::string>& events, const std::string& prefix) {
    return std::count_if(events.begin(), events.end(), [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
  };
  SECTION("three failures in a row: recovered") {
    testing::TempDir dir;
    FakeCluster cluster({});
    cluster.FailNext("learner.TrainStep", absl::UnavailableError("gone"), 3);
    ExperimentRunner runner(Options(Config(stage), dir.path()), cluster.MakeClients());
    REQUIRE(runner.Run().ok());
    CHECK(runner.status().metrics().at("recoveries") == 3);
  }
  SECTION("four: the step's error") {
    testing::TempDir dir;
    FakeCluster cluster({});
    cluster.FailNext("learner.TrainStep", absl::UnavailableError("gone"), 4);
    ExperimentRunner runner(Options(Config(stage), dir.path()), cluster.MakeClients());
    absl::Status s = runner.Run();
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK(count(cluster.events(), "learner.Configure") == 4);  // the stage's, then 3 recoveries
    CHECK(runner.status().state() == "FAILED");
  }
  SECTION("a role that dies again during the recovery: the recovery is tried again") {
    testing::TempDir dir;
    FakeCluster cluster({});
    cluster.FailNext("learner.TrainStep", absl::UnavailableError("gone"), 1);
    cluster.FailNext("health.Wait", absl::UnavailableError("killed again"), 1);
    ExperimentRunner runner(Options(Config(stage), dir.path()), cluster.MakeClients());
    absl::Status s = runner.Run();
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(runner.status().metrics().at("recoveries") == 1);
    CHECK(count(cluster.events(), "learner.Configure") == 2);  // the stage's, then the recovery that got through
  }
  SECTION("a recovery that keeps failing counts against the step's three tries") {
    testing::TempDir dir;
    FakeCluster cluster({});
    cluster.FailNext("learner.TrainStep", absl::UnavailableError("gone"), 1);
    cluster.FailNext("health.Wait", absl::UnavailableError("killed again"), 3);
    ExperimentRunner runner(Options(Config(stage), dir.path()), cluster.MakeClients());
    CHECK(runner.Run().code() == absl::StatusCode::kUnavailable);
    CHECK(count(cluster.events(), "learner.Configure") == 1);
  }
  SECTION("INVALID_ARGUMENT: no recovery") {
    testing::TempDir dir;
    FakeCluster cluster({});
    cluster.FailNext("learner.TrainStep", absl::InvalidArgumentError("bad"), 1);
    ExperimentRunner runner(Options(Config(stage), dir.path()), cluster.MakeClients());
    CHECK(runner.Run().code() == absl::StatusCode::kInvalidArgument);
    CHECK(count(cluster.events(), "health.Wait") == 0);
  }
}

TEST_CASE("resume: finished stages are skipped, the stage in progress resumes from its checkpoint") {
  testing::TempDir dir;
  FakeCluster cluster({});
  const std::string stages =
      "  - sft: {steps: 3, batch: 4, optimizer: {lr: 1.0e-3}}\n"
      "  - grpo: {rl: {steps: 6, prompts_per_step: 2, samples_per_prompt: 2, optimizer: {lr: 1.0e-4}}}\n";
  const ExperimentConfig cfg = Config(stages, "checkpoint: {every: 2}\n");
  // The first run dies in GRPO step 5 (0-based 4), after the checkpoint at 4.
  cluster.CrashLearnerAt(0, 4, absl::InternalError("killed"));
  {
    ExperimentRunner runner(Options(cfg, dir.path()), cluster.MakeClients());
    REQUIRE(runner.Run().code() == absl::StatusCode::kInternal);
  }
  const size_t first_events = cluster.events().size();
  const size_t first_trains = cluster.trains().size();
  const std::vector<int64_t> first_versions = LoadedVersions(cluster);
  int64_t first_round = 0;
  for (const auto& g : cluster.generations()) {
    if (g.pipeline) first_round = std::max(first_round, g.round);
  }
  CHECK(first_round == 5);

  RunnerOptions o = Options(cfg, dir.path());
  o.resume = true;
  // Fresh rollout workers (a relaunched cluster); the learners' checkpoints
  // are on disk (the fake cluster keeps them).
  ExperimentRunner runner(o, cluster.MakeClients());
  absl::Status s = runner.Run();
  INFO(s.ToString());
  REQUIRE(s.ok());
  const auto all = cluster.events();
  const std::vector<std::string> second(all.begin() + first_events, all.end());
  // SFT is not configured again; GRPO resumes at step 4 from its checkpoint.
  CHECK(std::count(second.begin(), second.end(), "learner.Configure stage=0 step=0") == 0);
  CHECK(second.front() == "learner.Configure stage=1 step=4");
  const auto trains = cluster.trains();
  std::vector<int64_t> steps;
  for (size_t i = first_trains; i < trains.size(); ++i) steps.push_back(trains[i].step);
  CHECK(steps == std::vector<int64_t>{4, 5});
  // Rounds keep counting (trajectory ids stay unique) and the workers'
  // versions keep increasing past what the first run loaded.
  std::vector<int64_t> rounds;
  for (const auto& g : cluster.generations()) {
    if (g.pipeline) rounds.push_back(g.round);
  }
  CHECK(rounds == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7});
  const std::vector<int64_t> v = LoadedVersions(cluster);
  REQUIRE(v.size() > first_versions.size());
  CHECK(v[first_versions.size()] == first_versions.back() + 1);
  // No eval before the first stage again: the summary has the stored one.
  CHECK(std::count(second.begin(), second.end(), "rollout.Generate eval") == 1);  // GRPO's final eval
  const auto summary = runner.summary();
  REQUIRE(summary.accuracy.size() == 3);
  CHECK(summary.accuracy[0].first == "init");
  CHECK(summary.accuracy[1].first == "sft");
}

TEST_CASE("held-out eval reports greedy accuracy and the unbiased pass@k") {
  testing::TempDir dir;
  // Sample 0 of every prompt is right, the others wrong: greedy (one sample)
  // is always right; with n = 4 samples, c = 1, so pass@1 = 1/4 and
  // pass@2 = 1 - C(3,2)/C(4,2) = 1/2, pass@4 = 1.
  FakeCluster cluster({.right = [](const std::string&, int sample) { return sample == 0; }});
  ExperimentRunner runner(Options(Config(kGrpo, "eval: {pass_at: [1, 2, 4], prompts: 5}\n"), dir.path()),
                          cluster.MakeClients());
  REQUIRE(runner.Run().ok());
  const auto evals = Records(dir.path(), "eval");
  REQUIRE(evals.size() == 2);  // before the stage and after it
  for (const auto& e : evals) {
    CHECK(e["accuracy"].get<double>() == 1.0);
    CHECK(e["prompts"].get<int>() == 5);
    CHECK(e["pass@1"].get<double>() == Approx(0.25));
    CHECK(e["pass@2"].get<double>() == Approx(0.5));
    CHECK(e["pass@4"].get<double>() == Approx(1.0));
  }
  CHECK(runner.status().metrics().at("pass@2") == Approx(0.5));
  // The sampled eval asked for n = max k samples per prompt.
  int sampled = 0;
  for (const auto& g : cluster.generations()) {
    if (!g.pipeline && g.n == 4) ++sampled;
  }
  CHECK(sampled == 2);
}

// Sync GRPO on two fake workers, 4 prompts a step (2 per worker), with the
// straggler settings `rollout`, e.g. "request_timeout_ms: 300".
RunnerOptions StragglerOptions(const std::string& rollout, const std::string& run_dir) {
  ExperimentConfig cfg;
  YamlSource src;
  const std::string yaml =
      "name: t\nseed: 7\nmodel: {tokenizer: char}\n"
      "task: {kind: arithmetic, digits: 1, train: 64, eval: 8}\n"
      "stages:\n"
      "  - grpo: {rl: {steps: 2, prompts_per_step: 4, samples_per_prompt: 2, optimizer: {lr: 1.0e-4}}}\n"
      "rollout: {workers: 2, sampling: {temperature: 1.0, max_new_tokens: 3}, " +
      rollout + "}\nlearner: {shards: 1}\n";
  absl::Status s = MergeYaml(yaml, &cfg, &src);
  if (s.ok()) s = NormalizeExperiment(&cfg, src);
  INFO(s.ToString());
  REQUIRE(s.ok());
  RunnerOptions o = Options(cfg, run_dir);
  o.rollout_workers = {"fake:3", "fake:5"};
  return o;
}

// The pipeline generations of round `round`, in call order.
std::vector<FakeCluster::Generation> Round(const FakeCluster& c, int64_t round) {
  std::vector<FakeCluster::Generation> out;
  for (const auto& g : c.generations()) {
    if (g.pipeline && g.round == round) out.push_back(g);
  }
  return out;
}

TEST_CASE("a stuck rollout worker: its missing prompts go to the other worker, keyed as before, stored once") {
  testing::TempDir dir;
  FakeCluster cluster({.rollouts = 2});
  // Worker 0 streams one of its two groups of step 1, then hangs; when its
  // call is cancelled it still stores the other (a put already in flight).
  cluster.HangGenerate(0, 1, /*deliver_first=*/1, /*store_late=*/true);
  ExperimentRunner runner(StragglerOptions("request_timeout_ms: 300", dir.path()), cluster.MakeClients());
  const absl::Time start = absl::Now();
  absl::Status s = runner.Run();
  INFO(s.ToString());
  REQUIRE(s.ok());
  // Bounded by the deadline, far below the fake's 10 s cap for a call
  // nobody cancels (which would have failed the step into a recovery).
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(runner.status().metrics().count("recoveries") == 0);

  const auto gens = Round(cluster, 1);
  REQUIRE(gens.size() == 3);
  // Worker 0 hung on prompts 0 and 2 of the step; prompt 2 (its stream key
  // 2: its place in the step) was re-sent to worker 1 in the same round.
  const auto hung = std::find_if(gens.begin(), gens.end(), [](const auto& g) { return g.hung; });
  REQUIRE(hung != gens.end());
  CHECK(hung->worker == 0);
  REQUIRE(hung->prompt_ids.size() == 2);
  const FakeCluster::Generation& again = gens.back();
  CHECK(again.worker == 1);
  CHECK(again.prompt_ids == std::vector<std::string>{hung->prompt_ids[1]});
  CHECK(again.stream_keys == std::vector<int64_t>{2});

  // The late copy and the redispatched one have one group id: stored once,
  // and the learner trained on exactly the step's four groups.
  CHECK(cluster.duplicate_puts() == 1);
  const auto trains = cluster.trains();
  REQUIRE(trains.size() == 2);
  std::set<std::string> want;
  for (const auto& g : gens) {
    for (const auto& id : g.prompt_ids) want.insert("exp/1/" + id);
  }
  REQUIRE(want.size() == 4);
  CHECK(std::set<std::string>(trains[0].group_ids.begin(), trains[0].group_ids.end()) == want);
  CHECK(trains[0].group_ids.size() == 4);
  CHECK(trains[1].group_ids.size() == 4);
  for (const auto& id : trains[1].group_ids) CHECK(id.rfind("exp/2/", 0) == 0);

  const auto steps = Records(dir.path(), "step");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0]["rollout_timeouts"].get<double>() == 1);
  CHECK(steps[0]["rollout_redispatched_prompts"].get<double>() == 1);
  CHECK(steps[0]["rollout_dropped_prompts"].get<double>() == 0);
  CHECK(steps[1]["rollout_timeouts"].get<double>() == 0);
  CHECK(runner.status().metrics().at("rollout_timeouts") == 1);
}

TEST_CASE("a stuck rollout worker under on_timeout drop: the step trains on the groups that arrived") {
  testing::TempDir dir;
  FakeCluster cluster({.rollouts = 2});
  cluster.HangGenerate(1, 1, /*deliver_first=*/0);
  ExperimentRunner runner(StragglerOptions("request_timeout_ms: 300, on_timeout: drop", dir.path()),
                          cluster.MakeClients());
  const absl::Time start = absl::Now();
  absl::Status s = runner.Run();
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(absl::Now() - start < absl::Seconds(5));
  CHECK(runner.status().metrics().count("recoveries") == 0);
  CHECK(Round(cluster, 1).size() == 2);  // nothing re-sent
  const auto trains = cluster.trains();
  REQUIRE(trains.size() == 2);
  // Worker 0's two groups only; the learner does not wait for the others.
  CHECK(trains[0].group_ids.size() == 2);
  CHECK(trains[1].group_ids.size() == 4);
  const auto steps = Records(dir.path(), "step");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0]["rollout_timeouts"].get<double>() == 1);
  CHECK(steps[0]["rollout_dropped_prompts"].get<double>() == 2);
  CHECK(steps[0]["rollout_redispatched_prompts"].get<double>() == 0);
}

}  // namespace
}  // namespace rlmesh
