// The five binaries as real processes: each starts on port 0, serves health,
// enforces the shared token, and exits 0 on SIGTERM within 2 s; the
// coordinator launches a cluster, reports every role's health and restarts
// a role killed with SIGKILL. Every child is killed whatever happens
// (Subprocess's destructor).
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "catch2/catch.hpp"
#include "common/grpc_status.h"
#include "common/rpc_client.h"
#include "common/subprocess.h"
#include "common/testing/script.h"
#include "common/testing/test_util.h"
#include "dist/cuda_api.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/learner.grpc.pb.h"
#include "proto/replay_buffer.grpc.pb.h"
#include "proto/reward.grpc.pb.h"
#include "proto/rollout.grpc.pb.h"

namespace rlmesh {
namespace {

using testing::Runfile;
using testing::TempDir;

struct Binary {
  std::string name;
  std::string path;
  std::vector<std::string> extra;
  // Calls the role's cheapest authenticated RPC.
  std::function<grpc::Status(const RpcClient&)> call;
};

template <typename Stub, typename Req, typename Resp>
grpc::Status CallUnary(const RpcClient& c,
                       grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*)) {
  Stub stub(c.channel());
  Req req;
  Resp resp;
  auto ctx = c.NewContext(absl::Seconds(5));
  return (stub.*method)(ctx.get(), req, &resp);
}

std::vector<Binary> AllBinaries(const TempDir& dir) {
  return {
      {"coordinator", Runfile("coordinator/coordinator"), {"serve"},
       [](const RpcClient& c) {
         return CallUnary<Coordinator::Stub, ListRequest, ListResponse>(c, &Coordinator::Stub::List);
       }},
      {"rollout_worker", Runfile("rollout/rollout_worker"), {},
       [](const RpcClient& c) {
         return CallUnary<RolloutService::Stub, RolloutStatusRequest, RolloutStatus>(
             c, &RolloutService::Stub::GetStatus);
       }},
      {"reward_server", Runfile("reward_server/reward_server"), {},
       [](const RpcClient& c) {
         return CallUnary<RewardService::Stub, RewardStatusRequest, RewardStatus>(
             c, &RewardService::Stub::GetStatus);
       }},
      {"replay_buffer", Runfile("replay_buffer/replay_buffer"), {"--db_path=" + dir.File("rb")},
       [](const RpcClient& c) {
         return CallUnary<ReplayBuffer::Stub, StatsRequest, StatsResponse>(c, &ReplayBuffer::Stub::Stats);
       }},
      {"learner", Runfile("learner/learner"), {},
       [](const RpcClient& c) {
         return CallUnary<Learner::Stub, LearnerStatusRequest, LearnerStatus>(c, &Learner::Stub::GetStatus);
       }},
  };
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Running {
  Binary bin;
  Subprocess proc;
  int port;
};

Running StartBinary(const Binary& b, const TempDir& dir, const std::vector<std::string>& more) {
  std::vector<std::string> argv = {b.path};
  // The coordinator's subcommand comes first.
  for (const auto& e : b.extra) argv.push_back(e);
  argv.push_back("--port=0");
  argv.push_back("--port_file=" + dir.File(b.name + ".port"));
  for (const auto& m : more) argv.push_back(m);
  auto p = Subprocess::Start(argv, dir.File(b.name + ".log"));
  REQUIRE(p.ok());
  auto port = ReadPortFile(dir.File(b.name + ".port"), absl::Seconds(30));
  INFO(b.name << " log:\n" << ReadAll(dir.File(b.name + ".log")));
  REQUIRE(port.ok());
  return {b, std::move(*p), *port};
}

// `coordinator launch` on `yaml` (written to <dir>/<name>), run until it
// exits within `timeout`: its wait status and everything it printed.
struct LaunchResult {
  int status = -1;
  std::string out;
};

LaunchResult LaunchToExit(const TempDir& dir, const std::string& name, const std::string& yaml,
                          const std::vector<std::string>& extra, absl::Duration timeout) {
  std::ofstream(dir.File(name)) << yaml;
  std::vector<std::string> argv = {Runfile("coordinator/coordinator"), "launch", "--cluster=" + dir.File(name),
                                   "--bin_dir=" + Runfile("")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const std::string out_file = dir.File(name + ".out");
  auto coord = Subprocess::Start(argv, out_file);
  REQUIRE(coord.ok());
  auto st = coord->Wait(timeout);
  INFO(ReadAll(out_file));
  REQUIRE(st.ok());
  return {*st, ReadAll(out_file)};
}

void ExpectCleanStop(Running& r, const TempDir& dir) {
  const absl::Time start = absl::Now();
  r.proc.Signal(SIGTERM);
  auto st = r.proc.Wait(absl::Seconds(2));
  INFO(r.bin.name << " log:\n" << ReadAll(dir.File(r.bin.name + ".log")));
  REQUIRE(st.ok());
  CHECK(DescribeWaitStatus(*st) == "exit 0");
  CHECK(absl::Now() - start < absl::Seconds(2));
}

TEST_CASE("each binary serves health on port 0 and exits 0 on SIGTERM within 2 s") {
  TempDir dir;
  std::vector<Running> running;
  for (const auto& b : AllBinaries(dir)) running.push_back(StartBinary(b, dir, {}));
  for (auto& r : running) {
    auto client = RpcClient::Create("127.0.0.1:" + std::to_string(r.port));
    REQUIRE(client.ok());
    INFO(r.bin.name);
    REQUIRE(WaitUntilServing(*client, absl::Seconds(10)).ok());
    CHECK(*CheckHealth(*client, absl::Seconds(5)) == "SERVING");
    // Without auth configured, the role's own RPC is served.
    CHECK(r.bin.call(*client).ok());
    const std::string out = ReadAll(dir.File(r.bin.name + ".log"));
    CHECK(out.find("listening on 127.0.0.1:" + std::to_string(r.port)) != std::string::npos);
  }
  for (auto& r : running) ExpectCleanStop(r, dir);
}

TEST_CASE("with a token, every role rejects calls that lack it") {
  TempDir dir;
  std::ofstream(dir.File("token")) << "t0ken-for-test\n";
  std::vector<Running> running;
  for (const auto& b : AllBinaries(dir)) {
    running.push_back(StartBinary(b, dir, {"--auth_token_file=" + dir.File("token")}));
  }
  for (auto& r : running) {
    INFO(r.bin.name);
    const std::string addr = "127.0.0.1:" + std::to_string(r.port);
    auto anonymous = RpcClient::Create(addr);
    REQUIRE(WaitUntilServing(*anonymous, absl::Seconds(10)).ok());  // health stays open
    CHECK(r.bin.call(*anonymous).error_code() == grpc::StatusCode::UNAUTHENTICATED);
    ClientOptions wrong;
    wrong.auth_token = "not-the-token";
    CHECK(r.bin.call(*RpcClient::Create(addr, wrong)).error_code() == grpc::StatusCode::UNAUTHENTICATED);
    ClientOptions right;
    right.auth_token = "t0ken-for-test";
    CHECK(r.bin.call(*RpcClient::Create(addr, right)).ok());
  }
  for (auto& r : running) ExpectCleanStop(r, dir);
}

TEST_CASE("bad flags, ports in use and unreadable files give one line and a non-zero exit") {
  TempDir dir;
  for (const auto& b : AllBinaries(dir)) {
    INFO(b.name);
    std::vector<std::string> argv = {b.path};
    for (const auto& e : b.extra) argv.push_back(e);
    argv.push_back("--no_such_flag=1");
    auto p = Subprocess::Start(argv, dir.File(b.name + ".badflag"));
    REQUIRE(p.ok());
    auto st = p->Wait(absl::Seconds(10));
    REQUIRE(st.ok());
    CHECK(*st != 0);
    CHECK(ReadAll(dir.File(b.name + ".badflag")).find("no_such_flag") != std::string::npos);

    argv.back() = "--auth_token_file=" + dir.File("missing");
    auto q = Subprocess::Start(argv, dir.File(b.name + ".missing"));
    REQUIRE(q.ok());
    st = q->Wait(absl::Seconds(10));
    REQUIRE(st.ok());
    CHECK(*st != 0);
    CHECK(ReadAll(dir.File(b.name + ".missing")).find("missing") != std::string::npos);
  }
  // Port in use.
  auto all = AllBinaries(dir);
  Running first = StartBinary(all[2], dir, {});
  auto second = Subprocess::Start({all[2].path, "--port=" + std::to_string(first.port)}, dir.File("inuse"));
  REQUIRE(second.ok());
  auto st = second->Wait(absl::Seconds(10));
  REQUIRE(st.ok());
  CHECK(*st != 0);
  CHECK(ReadAll(dir.File("inuse")).find("cannot listen on 127.0.0.1:" + std::to_string(first.port)) !=
        std::string::npos);
}

TEST_CASE("coordinator --help lists every subcommand; unknown ones are refused") {
  TempDir dir;
  auto p = Subprocess::Start({Runfile("coordinator/coordinator"), "--help"}, dir.File("help"));
  REQUIRE(p.ok());
  REQUIRE(*p->Wait(absl::Seconds(10)) == 0);
  const std::string help = ReadAll(dir.File("help"));
  for (const char* cmd : {"launch", "submit", "status", "list", "cancel", "run"}) {
    CHECK(help.find(std::string("  ") + cmd + " ") != std::string::npos);
  }
  auto q = Subprocess::Start({Runfile("coordinator/coordinator"), "frobnicate"}, dir.File("unknown"));
  REQUIRE(q.ok());
  CHECK(*q->Wait(absl::Seconds(10)) != 0);
  CHECK(ReadAll(dir.File("unknown")).find("unknown command 'frobnicate'") != std::string::npos);
}

// `coordinator launch` of `yaml` in the background, with its RPC client.
struct Launched {
  Subprocess coordinator;
  std::shared_ptr<RpcClient> client;
  std::unique_ptr<Coordinator::Stub> stub;

  // Every role the coordinator reports, by name.
  std::map<std::string, RoleInfo> Roles() {
    StatusResponse resp;
    auto ctx = client->NewContext(absl::Seconds(10));
    grpc::Status s = stub->GetStatus(ctx.get(), StatusRequest(), &resp);
    INFO(s.error_message());
    REQUIRE(s.ok());
    std::map<std::string, RoleInfo> by_name;
    for (const auto& r : resp.roles()) by_name[r.name()] = r;
    return by_name;
  }
};

Launched LaunchInBackground(const TempDir& dir, const std::string& yaml, const std::vector<std::string>& extra) {
  std::ofstream(dir.File("cluster.yaml")) << yaml;
  std::vector<std::string> argv = {Runfile("coordinator/coordinator"), "launch",
                                   "--cluster=" + dir.File("cluster.yaml"), "--run_dir=" + dir.File("run"),
                                   "--bin_dir=" + Runfile(""), "--port_file=" + dir.File("coord.port")};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto coord = Subprocess::Start(argv, dir.File("coordinator.log"));
  REQUIRE(coord.ok());
  auto port = ReadPortFile(dir.File("coord.port"), absl::Seconds(60));
  INFO("coordinator log:\n" << ReadAll(dir.File("coordinator.log")));
  REQUIRE(port.ok());
  auto client = RpcClient::Create("127.0.0.1:" + std::to_string(*port));
  REQUIRE(client.ok());
  std::shared_ptr<RpcClient> shared(new RpcClient(std::move(*client)));
  auto stub = Coordinator::NewStub(shared->channel());
  return {std::move(*coord), shared, std::move(stub)};
}

TEST_CASE("coordinator launch starts the cluster, reports health, restarts a killed role, stops cleanly") {
  TempDir dir;
  Launched launched = LaunchInBackground(dir,
                                         "name: t\ncoordinator_port: 0\nrollout_workers: 2\n"
                                         "reward_servers: 1\nlearners: 1\n",
                                         {});
  Subprocess* coord = &launched.coordinator;
  auto& client = launched.client;
  auto& stub = launched.stub;
  auto roles = [&]() { return launched.Roles(); };
  auto before = roles();
  REQUIRE(before.size() == 5);
  for (const auto& name : {"replay_buffer", "reward-0", "rollout-0", "rollout-1", "learner-0"}) {
    INFO(name);
    REQUIRE(before.count(name) == 1);
    CHECK(before[name].health() == "SERVING");
    CHECK(before[name].restarts() == 0);
  }
  // The port file is written when the server starts, just before this line.
  {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (ReadAll(dir.File("coordinator.log")).find("rlmesh: cluster up") == std::string::npos &&
           absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  CHECK(ReadAll(dir.File("coordinator.log")).find("rlmesh: cluster up") != std::string::npos);
  for (const char* log : {"replay_buffer", "reward-0", "rollout-0", "rollout-1", "learner-0"}) {
    CHECK(ReadAll(dir.File(std::string("run/logs/") + log + ".log")).find("listening") != std::string::npos);
  }

  // The workers decode with the cluster's tokenizer (char): an experiment
  // with another one is refused, naming the field.
  {
    SubmitRequest req;
    ExperimentConfig* e = req.mutable_experiment();
    e->set_name("other-tokenizer");
    e->mutable_model()->set_tokenizer(dir.File("elsewhere/tokenizer.json"));
    e->mutable_task()->set_kind("arithmetic");
    e->mutable_rollout()->set_workers(2);
    e->mutable_learner()->set_shards(1);
    e->add_stages()->mutable_sft()->set_steps(1);
    e->mutable_stages(0)->mutable_sft()->set_batch(1);
    e->mutable_stages(0)->mutable_sft()->mutable_optimizer()->set_lr(1e-3);
    SubmitResponse resp;
    auto ctx = client->NewContext(absl::Seconds(10));
    grpc::Status s = stub->Submit(ctx.get(), req, &resp);
    INFO(s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    CHECK(s.error_message().find("model.tokenizer") != std::string::npos);
    // A setting the workers only read at start is refused by name, not run
    // without it.
    e->mutable_model()->set_tokenizer("char");
    e->mutable_rollout()->set_max_batch(256);
    auto ctx2 = client->NewContext(absl::Seconds(10));
    s = stub->Submit(ctx2.get(), req, &resp);
    INFO(s.error_message());
    CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    CHECK(s.error_message().find("rollout.max_batch") != std::string::npos);
  }

  // SIGKILL one worker: the coordinator restarts it on the same address.
  const pid_t victim = static_cast<pid_t>(before["rollout-1"].pid());
  REQUIRE(::kill(victim, SIGKILL) == 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  RoleInfo after;
  while (absl::Now() < deadline) {
    after = roles()["rollout-1"];
    if (after.restarts() == 1 && after.health() == "SERVING") break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  CHECK(after.restarts() == 1);
  CHECK(after.health() == "SERVING");
  CHECK(after.pid() != victim);
  CHECK(after.address() == before["rollout-1"].address());

  // SIGTERM: the coordinator stops every child and exits 0.
  auto now = roles();
  coord->Signal(SIGTERM);
  auto st = coord->Wait(absl::Seconds(15));
  REQUIRE(st.ok());
  CHECK(DescribeWaitStatus(*st) == "exit 0");
  for (const auto& [name, info] : now) {
    INFO(name);
    CHECK(::kill(static_cast<pid_t>(info.pid()), 0) != 0);  // gone
  }
}

// A Score request can name a `command` verifier, which the reward server
// runs as a program. Only the programs its operator listed may run; any
// other, and the same refusal through a symlink elsewhere, is refused.
TEST_CASE("the reward server runs only the command verifiers --allowed_commands lists") {
  TempDir dir;
  const std::string allowed = testing::WriteScript(dir, "judge.sh", "echo 0.75");
  const std::string other = testing::WriteScript(dir, "other.sh", "touch " + dir.File("other-ran") + "; echo 1");
  REQUIRE(::symlink(other.c_str(), dir.File("judge-link.sh").c_str()) == 0);
  Launched launched = LaunchInBackground(dir, "name: t\ncoordinator_port: 0\n", {"--allowed_commands=" + allowed});
  auto roles = launched.Roles();
  REQUIRE(roles.count("reward-0") == 1);
  auto reward = RpcClient::Create(roles["reward-0"].address());
  REQUIRE(reward.ok());
  auto score = [&](const std::string& program, ScoreResponse* resp) {
    ScoreRequest req;
    ScoreItem* item = req.add_items();
    item->set_completion_text("42");
    item->set_reference_answer("42");
    VerifierConfig* v = req.add_verifiers();
    v->set_name("command");
    v->add_command(program);
    req.set_verifier_timeout_ms(5000);
    auto ctx = reward->NewContext(absl::Seconds(20));
    return RewardService::NewStub(reward->channel())->Score(ctx.get(), req, resp);
  };
  ScoreResponse resp;
  grpc::Status s = score(allowed, &resp);
  INFO(s.error_message());
  REQUIRE(s.ok());
  CHECK(resp.results(0).reward() == 0.75);
  for (const std::string& refused : {other, dir.File("judge-link.sh"), std::string("/bin/true")}) {
    INFO(refused);
    s = score(refused, &resp);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(s.error_message().find("verifiers[0].command: '" + refused + "' is not a program") != std::string::npos);
  }
  CHECK(::access(dir.File("other-ran").c_str(), F_OK) != 0);  // never ran
  // The same name reached another way (a "." in the path) is still the listed program.
  const std::string dotted = dir.File("./judge.sh");
  s = score(dotted, &resp);
  INFO(s.error_message());
  CHECK(s.ok());
  // An experiment naming another program is refused when submitted, not at
  // its first Score after SFT.
  SubmitRequest req;
  ExperimentConfig* e = req.mutable_experiment();
  e->set_name("other-judge");
  e->mutable_task()->set_kind("arithmetic");
  e->add_stages()->mutable_sft()->set_steps(1);
  e->mutable_stages(0)->mutable_sft()->set_batch(1);
  e->mutable_stages(0)->mutable_sft()->mutable_optimizer()->set_lr(1e-3);
  VerifierConfig* v = e->mutable_reward()->add_verifiers();
  v->set_name("command");
  v->add_command(other);
  SubmitResponse submitted;
  auto ctx = launched.client->NewContext(absl::Seconds(10));
  s = launched.stub->Submit(ctx.get(), req, &submitted);
  INFO(s.error_message());
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(s.error_message().find("reward.verifiers[0].command: '" + other + "' is not a program the cluster's") !=
        std::string::npos);
  launched.coordinator.Signal(SIGTERM);
  auto st = launched.coordinator.Wait(absl::Seconds(15));
  REQUIRE(st.ok());
  CHECK(DescribeWaitStatus(*st) == "exit 0");
}

TEST_CASE("coordinator launch --exit_after_health prints the table and exits 0") {
  TempDir dir;
  const LaunchResult r = LaunchToExit(dir, "cluster.yaml", "name: t\ncoordinator_port: 0\n",
                                      {"--run_dir=" + dir.File("run"), "--exit_after_health"}, absl::Seconds(60));
  const std::string& out = r.out;
  INFO(out);
  CHECK(r.status == 0);
  for (const char* name : {"replay_buffer", "reward-0", "rollout-0", "learner-0"}) {
    CHECK(out.find(name) != std::string::npos);
  }
  CHECK(out.find("NOT_SERVING") == std::string::npos);
  CHECK(out.find("all roles were serving") != std::string::npos);
}

// The local launcher's GPU placement, end to end: the rollout worker it
// starts gets CUDA_VISIBLE_DEVICES and --device=cuda and resolves it at
// start. Without a GPU (this machine) the launch fails naming the worker, the
// device and the variable; where the CUDA runtime sees a GPU it must serve.
TEST_CASE("coordinator launch gives a role its GPU; without one the start fails naming role and device") {
  TempDir dir;
  const LaunchResult r =
      LaunchToExit(dir, "cluster.yaml",
                   "name: t\ncoordinator_port: 0\ngpus: {rollout_worker: [0], rollout_worker_memory_fraction: 0.4}\n",
                   {"--run_dir=" + dir.File("run"), "--exit_after_health"}, absl::Seconds(60));
  const std::string& out = r.out;
  const std::string log = ReadAll(dir.File("run/logs/rollout-0.log"));
  INFO(out << "\nrollout-0.log:\n" << log);
  // Its share of the GPU reached it, before anything touched CUDA.
  CHECK(log.find("CUDA allocator capped: PYTORCH_ALLOC_CONF=per_process_memory_fraction:0.4") != std::string::npos);
  if (dist::CudaDeviceCount().ok()) {
    CHECK(r.status == 0);
    CHECK(out.find("all roles were serving") != std::string::npos);
  } else {
    CHECK(r.status != 0);
    CHECK(out.find("rollout-0 did not start (exited)") != std::string::npos);
    CHECK(log.find("rollout-0 --device=cuda:0: no CUDA device visible (CUDA_VISIBLE_DEVICES \"0\"") !=
          std::string::npos);
  }
}

TEST_CASE("GPU lists that put two processes on one GPU are refused by name") {
  TempDir dir;
  struct Case {
    const char* yaml;
    const char* message;
  } cases[] = {
      {"gpus: {learner: [0], rollout_worker: [0]}\n",
       "gpus: learner-0 and rollout-0 would share GPU 0; set gpus.colocate: true"},
      {"rollout_workers: 2\ngpus: {rollout_worker: [1]}\n",
       "gpus: rollout-0 and rollout-1 would share GPU 1 (one GPU per process of a role"},
      {"gpus: {reward_server: [64]}\n", "gpus.reward_server[0]: 64 is not a GPU index in [0, 63]"},
      {"gpus: {learner_memory_fraction: 0.5}\n",
       "gpus.learner_memory_fraction: set but gpus.learner is empty (the role computes on the CPU)"},
      {"gpus: {rollout_worker: [0], rollout_worker_memory_fraction: 2}\n",
       "gpus.rollout_worker_memory_fraction: 2 is not in [0, 1]"},
      {"gpus: {learner: [0], rollout_worker: [0], colocate: true, learner_memory_fraction: 0.6, "
       "rollout_worker_memory_fraction: 0.5}\n",
       "gpus: the memory fractions of the processes on GPU 0 sum to 1.1 > 1"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const LaunchResult r = LaunchToExit(dir, absl::StrCat("c", i++, ".yaml"),
                                        std::string("name: t\ncoordinator_port: 0\n") + c.yaml,
                                        {"--run_dir=" + dir.File("run")}, absl::Seconds(20));
    INFO(r.out);
    CHECK(r.status != 0);
    CHECK(r.out.find(c.message) != std::string::npos);
  }
}

TEST_CASE("coordinator run --dry-run prints the Slurm job, or a local run's memory plan, and writes nothing") {
  TempDir dir;
  std::ofstream(dir.File("slurm.yaml")) << "name: s\nlauncher: slurm\nrollout_workers: 1\nslurm: {nodes: 2, "
                                           "learner_nodes: [0], rollout_worker_nodes: [1], coordinator_address: "
                                           "\"10.0.0.1\"}\n";
  std::ofstream(dir.File("exp.yaml")) << "name: dry\ntask: {kind: arithmetic}\n"
                                         "stages:\n  - sft: {steps: 1, batch: 1, optimizer: {lr: 1.0e-3}}\n";
  auto run = [&](const std::vector<std::string>& extra, const std::string& out) {
    std::vector<std::string> argv = {Runfile("coordinator/coordinator"), "run", dir.File("exp.yaml"),
                                     "--run_dir=" + dir.File("runs"), "--bin_dir=" + Runfile(""), "--dry-run"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = Subprocess::Start(argv, dir.File(out));
    REQUIRE(p.ok());
    auto st = p->Wait(absl::Seconds(30));
    REQUIRE(st.ok());
    return *st;
  };
  CHECK(run({"--cluster=" + dir.File("slurm.yaml"), "--profile"}, "slurm.out") == 0);
  const std::string script = ReadAll(dir.File("slurm.out"));
  INFO(script);
  CHECK(script.find("#SBATCH --nodes=2") != std::string::npos);
  CHECK(script.find("--job-name=learner-0") != std::string::npos);
  CHECK(script.find("--coordinator=10.0.0.1:") != std::string::npos);
  CHECK(!std::filesystem::exists(dir.File("runs")));  // no run folder, no profile folder
  // A local run's dry run is its memory plan: it fits here.
  CHECK(run({}, "local.out") == 0);
  const std::string plan = ReadAll(dir.File("local.out"));
  INFO(plan);
  CHECK(plan.find("learner ") != std::string::npos);
  CHECK(plan.find("rollout_worker") != std::string::npos);
  CHECK(plan.find("cpu ") != std::string::npos);
  CHECK(!std::filesystem::exists(dir.File("runs")));
  // One that cannot fit is refused, naming the device and the roles.
  CHECK(run({"--set", "model.hidden=8192", "--set", "model.layers=64", "--set", "model.heads=64"}, "big.out") != 0);
  const std::string big = ReadAll(dir.File("big.out"));
  INFO(big);
  CHECK(big.find("does not fit: cpu needs") != std::string::npos);
  CHECK(big.find("learner x1") != std::string::npos);
  CHECK(!std::filesystem::exists(dir.File("runs")));
}

TEST_CASE("a bad cluster config names the key and line") {
  TempDir dir;
  const LaunchResult r = LaunchToExit(dir, "cluster.yaml", "name: t\nrollout_workerz: 2\n", {}, absl::Seconds(20));
  CHECK(r.status != 0);
  CHECK(r.out.find("cluster.yaml:2: rollout_workerz: unknown key") != std::string::npos);
}

}  // namespace
}  // namespace rlmesh
