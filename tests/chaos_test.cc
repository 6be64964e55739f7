// Chaos: a whole GRPO run (`coordinator run`, real processes) during which
// a driver SIGKILLs one role after another — the replay buffer, the reward
// server, each rollout worker, the learner — while a ledger writer keeps
// putting groups into the same replay buffer and records every group the
// buffer acknowledged. Checks: the run completes; it ends with exactly the
// policy of the same experiment run undisturbed first (same held-out
// accuracies, bit-identical weights: a synchronous run is deterministic and
// every recovery redoes its steps from a checkpoint with the same seeds, so
// no step is lost, trained twice or trained on other groups); every role
// came back (restart counts); and afterwards every acknowledged group is in
// the buffer (acknowledged groups lost = 0).
//
// CI size: 10 kills, 8-14 s apart, or sooner on a fast machine (every 14 of
// the 200 GRPO steps), so that the kills always land inside the stage.
// bench/chaos.sh runs the same binary with 100 kills for the long report.
//
// Environment (all optional): RLMESH_CHAOS_KILLS, RLMESH_CHAOS_MIN_S,
// RLMESH_CHAOS_MAX_S, RLMESH_CHAOS_SEED, RLMESH_CHAOS_STEPS (GRPO steps),
// RLMESH_CHAOS_REFERENCE (0: no undisturbed reference run), RLMESH_CHAOS_REPORT
// (a file that gets one JSON line with the figures).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/rpc_client.h"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"
#include "proto/coordinator.grpc.pb.h"
#include "proto/replay_buffer.grpc.pb.h"
#include "tests/run_util.h"

namespace rlmesh {
namespace {

using testing::LastStep;
using testing::ReadAll;
using testing::RunDir;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// The roles as the coordinator lists them, by name. The coordinator is
// never killed, but on a loaded machine one call can miss its 5 s
// deadline: tries for up to a minute, then returns an empty map.
std::map<std::string, RoleInfo> Roles(Coordinator::Stub* stub, const RpcClient& client) {
  std::map<std::string, RoleInfo> out;
  for (int attempt = 0; attempt < 12 && out.empty(); ++attempt) {
    StatusResponse status;
    auto ctx = client.NewContext(absl::Seconds(5));
    if (!stub->GetStatus(ctx.get(), StatusRequest(), &status).ok()) continue;
    for (const auto& r : status.roles()) out[r.name()] = r;
  }
  return out;
}

// A small valid group of the ledger's own experiment.
TrajectoryGroup LedgerGroup(int64_t k) {
  TrajectoryGroup g;
  g.set_experiment_id("chaos-ledger");
  g.set_group_id(absl::StrCat("g", k));
  g.set_prompt_id(absl::StrCat("p", k));
  g.set_step(k);
  for (int i = 0; i < 2; ++i) {
    Trajectory* t = g.add_samples();
    t->set_trajectory_id(absl::StrCat("g", k, "-", i));
    t->set_sample_index(i);
    t->set_reward(static_cast<double>(i));
    for (int j = 0; j < 4; ++j) {
      t->add_response_token_ids(j + 1);
      t->add_loss_mask(1);
      t->add_behaviour_logprobs(-1.0f);
    }
  }
  return g;
}

// What the ledger writer saw; read only after its thread is joined.
struct Ledger {
  std::vector<std::string> acked;  // group ids the buffer acknowledged, in order
  int failed = 0;                  // calls that ended in an error
  std::string first_error;
};

// Puts one ledger group after another (each call with a 2 s deadline)
// until `stop`, recording in `ledger` the ids the buffer acknowledged. A
// failed call (the buffer is down) is not retried: its group may or may not
// have been written, and only acknowledged groups are promised.
void WriteLedger(const std::string& address, const std::atomic<bool>* stop, Ledger* ledger) {
  auto client = RpcClient::Create(address);
  if (!client.ok()) return;
  auto stub = ReplayBuffer::NewStub(client->channel());
  for (int64_t k = 0; !stop->load(); ++k) {
    PutGroupsRequest req;
    *req.add_groups() = LedgerGroup(k);
    PutGroupsResponse resp;
    auto ctx = client->NewContext(absl::Seconds(2));
    const grpc::Status s = stub->PutGroups(ctx.get(), req, &resp);
    if (s.ok()) {
      ledger->acked.push_back(req.groups(0).group_id());
    } else if (ledger->failed++ == 0) {
      ledger->first_error = s.error_message();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// Group ids of `experiment` in the store at `db_path`, read through a
// replay_buffer process of its own (the run's is gone with the run).
std::set<std::string> StoredGroups(const testing::TempDir& dir, const std::string& db_path,
                                   const std::string& experiment) {
  auto server = Subprocess::Start({testing::Runfile("replay_buffer/replay_buffer"), "--port=0",
                                   "--port_file=" + dir.File("rb.port"), "--db_path=" + db_path},
                                  dir.File("rb.log"));
  REQUIRE(server.ok());
  auto port = ReadPortFile(dir.File("rb.port"), absl::Seconds(60));
  INFO(ReadAll(dir.File("rb.log")));
  REQUIRE(port.ok());
  auto client = RpcClient::Create(absl::StrCat("127.0.0.1:", *port));
  REQUIRE(client.ok());
  auto stub = ReplayBuffer::NewStub(client->channel());
  std::set<std::string> out;
  QueryRequest req;
  req.mutable_filter()->set_experiment_id(experiment);
  req.set_limit(10000);
  for (int page = 0; page < 1000; ++page) {
    QueryResponse resp;
    auto ctx = client->NewContext(absl::Seconds(30));
    auto s = stub->Query(ctx.get(), req, &resp);
    INFO(s.error_message());
    REQUIRE(s.ok());
    for (const auto& t : resp.trajectories()) out.insert(t.group_id());
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  server->Stop(absl::Seconds(10));
  return out;
}

TEST_CASE("a GRPO run survives repeated SIGKILL of every role and loses no acknowledged group") {
  const int kills = EnvInt("RLMESH_CHAOS_KILLS", 10);
  const int min_s = EnvInt("RLMESH_CHAOS_MIN_S", 8);
  const int max_s = std::max(min_s, EnvInt("RLMESH_CHAOS_MAX_S", 14));
  std::mt19937 rng(static_cast<uint32_t>(EnvInt("RLMESH_CHAOS_SEED", 7)));
  // Steps of the GRPO stage: enough that the kills land inside it whatever
  // the machine's speed, since a kill is also due every `steps_per_kill`
  // steps (below), spaced over 4/5 of the stage: each kill lands a step or
  // two after its trigger, and the stage must outlast the last one.
  const int steps = EnvInt("RLMESH_CHAOS_STEPS", std::max(60, kills * 16 + 40));
  const int steps_per_kill = std::max(4, (steps - 20) * 4 / (5 * kills));

  testing::TempDir dir;
  const std::vector<std::string> args = {absl::StrCat("--set=stages[1].grpo.rl.steps=", steps),
                                         "--set=stages[1].grpo.rl.prompts_per_step=16",
                                         "--set=logging.tensorboard=false"};
  const std::string config = testing::Runfile("configs/grpo_arith_e2e.yaml");

  // The same experiment undisturbed: synchronous runs are deterministic and
  // a recovery redoes its steps from a checkpoint with the same seeds, so the
  // chaos run must end with exactly this policy.
  // bench/chaos.sh turns it off (RLMESH_CHAOS_REFERENCE=0): its stage runs
  // thousands of steps, and it reports the figures below instead.
  const bool with_reference = EnvInt("RLMESH_CHAOS_REFERENCE", 1) != 0;
  std::string ref_dir, ref_weights;
  if (with_reference) {
    auto ref = testing::RunExperiment(config, dir.File("ref"), args, dir.File("ref.out"), absl::Minutes(20));
    INFO(ReadAll(dir.File("ref.out")));
    REQUIRE(ref.ok());
    REQUIRE(*ref == 0);
    ref_dir = RunDir(dir.File("ref"));
    ref_weights = ReadAll(testing::StageCheckpoint(ref_dir, 1) + "/model.safetensors");
    REQUIRE(!ref_weights.empty());
  }

  const std::string root = dir.File("runs");
  std::vector<std::string> argv = {testing::Runfile("coordinator/coordinator"), "run", config, "--run_dir=" + root,
                                   "--bin_dir=" + testing::Runfile("")};
  argv.insert(argv.end(), args.begin(), args.end());
  auto run = Subprocess::Start(argv, dir.File("out"));
  REQUIRE(run.ok());

  // Wait for the GRPO stage (SFT runs undisturbed: it builds the base).
  std::string run_dir;
  absl::Time deadline = absl::Now() + absl::Minutes(10);
  while (absl::Now() < deadline && run->running()) {
    if (run_dir.empty() && std::filesystem::exists(root)) run_dir = RunDir(root);
    if (!run_dir.empty() && LastStep(run_dir, "grpo") >= 2) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  INFO(ReadAll(dir.File("out")));
  REQUIRE(run->running());
  REQUIRE(!run_dir.empty());
  const std::string address = testing::CoordinatorAddress(ReadAll(dir.File("out")));
  REQUIRE(!address.empty());
  auto client = RpcClient::Create(address);
  REQUIRE(client.ok());
  auto stub = Coordinator::NewStub(client->channel());
  auto roles = Roles(stub.get(), *client);
  REQUIRE(roles.count("replay_buffer"));

  std::atomic<bool> stop{false};
  Ledger ledger;
  std::thread writer(WriteLedger, roles["replay_buffer"].address(), &stop, &ledger);

  const std::vector<std::string> order = {"replay_buffer", "reward-0", "rollout-0", "learner-0", "rollout-1"};
  std::map<std::string, int> killed;
  std::map<std::string, std::vector<double>> recovery;  // seconds from SIGKILL to SERVING again
  std::string failure;
  int done_kills = 0;
  int step_at_last_kill = LastStep(run_dir, "grpo");
  for (; done_kills < kills && failure.empty(); ++done_kills) {
    // The next kill: after a random 8-14 s, or sooner once the run has
    // advanced steps_per_kill steps since the last one.
    const absl::Time due = absl::Now() + absl::Seconds(std::uniform_int_distribution<int>(min_s, max_s)(rng));
    while (absl::Now() < due && run->running() && LastStep(run_dir, "grpo") < step_at_last_kill + steps_per_kill) {
      absl::SleepFor(absl::Milliseconds(200));
    }
    if (!run->running()) {
      failure = absl::StrCat("the run ended after ", done_kills, " of ", kills, " kills");
      break;
    }
    const std::string victim = order[done_kills % order.size()];
    roles = Roles(stub.get(), *client);
    if (!roles.count(victim) || roles[victim].pid() <= 0) {
      failure = "no pid for " + victim;
      break;
    }
    const int restarts_before = roles[victim].restarts();
    const absl::Time t0 = absl::Now();
    REQUIRE(::kill(static_cast<pid_t>(roles[victim].pid()), SIGKILL) == 0);
    ++killed[victim];
    step_at_last_kill = LastStep(run_dir, "grpo");
    // Back: restarted (a new pid) and serving again.
    bool back = false;
    while (!back && absl::Now() < t0 + absl::Minutes(3) && run->running()) {
      absl::SleepFor(absl::Milliseconds(100));
      roles = Roles(stub.get(), *client);
      back = roles.count(victim) && roles[victim].restarts() > restarts_before && roles[victim].health() == "SERVING";
    }
    if (!back) {
      failure = absl::StrCat(victim, " did not come back within 3 minutes of kill ", done_kills + 1);
      break;
    }
    recovery[victim].push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    std::cout << "chaos: kill " << done_kills + 1 << " role=" << victim << " at grpo step " << step_at_last_kill
              << ", serving again after " << recovery[victim].back() << " s" << std::endl;
  }
  // The restart counts the coordinator reports, after the last recovery.
  roles = Roles(stub.get(), *client);

  auto st = run->Wait(absl::Minutes(15));
  stop = true;
  writer.join();
  const std::string all = ReadAll(dir.File("out"));
  INFO(all);
  REQUIRE(failure.empty());
  REQUIRE(st.ok());
  CHECK(*st == 0);
  CHECK(all.find("done: held-out accuracy") != std::string::npos);
  CHECK(done_kills == kills);
  for (const auto& [name, n] : killed) {
    INFO("role " << name);
    REQUIRE(roles.count(name));
    CHECK(roles[name].restarts() >= n);
  }

  // The run trained every step and ended exactly where the undisturbed one
  // did: the same held-out accuracy after each stage, the same weights.
  CHECK(LastStep(run_dir, "grpo") == steps);
  auto accuracies = [](const std::string& d) {
    std::map<std::string, double> acc;
    std::istringstream metrics(ReadAll(d + "/metrics.jsonl"));
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("event", "") == "eval") acc[j["stage"].get<std::string>()] = j["accuracy"];
    }
    return acc;
  };
  std::map<std::string, double> final_acc = accuracies(run_dir);
  std::map<std::string, double> ref_acc = with_reference ? accuracies(ref_dir) : final_acc;
  INFO("sft " << final_acc["sft"] << " grpo " << final_acc["grpo"] << "; undisturbed: sft " << ref_acc["sft"]
              << " grpo " << ref_acc["grpo"]);
  CHECK(final_acc == ref_acc);
  const bool same_weights =
      with_reference && ReadAll(testing::StageCheckpoint(run_dir, 1) + "/model.safetensors") == ref_weights;
  CHECK(same_weights == with_reference);

  // No acknowledged group lost.
  INFO("acknowledged " << ledger.acked.size() << ", failed puts " << ledger.failed << " (first: "
                       << ledger.first_error << ")");
  REQUIRE(ledger.acked.size() >= 100);
  CHECK(ledger.failed >= 1);  // the buffer was really down at some point
  const std::set<std::string> stored = StoredGroups(dir, run_dir + "/replay_buffer", "chaos-ledger");
  std::vector<std::string> lost;
  for (const auto& id : ledger.acked) {
    if (!stored.count(id)) lost.push_back(id);
  }
  INFO("stored " << stored.size() << ", lost " << lost.size());
  CHECK(lost.empty());

  nlohmann::json report = {{"kills", done_kills},
                           {"grpo_steps", steps},
                           {"acked_groups", ledger.acked.size()},
                           {"failed_puts", ledger.failed},
                           {"lost_acked_groups", lost.size()},
                           {"sft_accuracy", final_acc["sft"]},
                           {"grpo_accuracy", final_acc["grpo"]},
                           {"with_reference", with_reference},
                           {"grpo_accuracy_undisturbed", with_reference ? ref_acc["grpo"] : -1.0},
                           {"weights_identical", same_weights}};
  for (const auto& [name, times] : recovery) {
    report["recovery_seconds"][name] = times;
    report["restarts"][name] = roles.count(name) ? roles[name].restarts() : -1;
  }
  std::cout << "chaos: " << report.dump() << std::endl;
  if (const char* path = std::getenv("RLMESH_CHAOS_REPORT"); path != nullptr && *path != '\0') {
    std::ofstream(path, std::ios::app) << report.dump() << "\n";
  }
}

}  // namespace
}  // namespace rlmesh
