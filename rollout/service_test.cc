// The gRPC side: the service in-process (streaming Generate equals actor/,
// auth, errors), then real processes: a Gloo weight update from this process
// (rank 0) into a rollout_worker binary (rank 1), and pipeline mode against
// real reward_server and replay_buffer binaries with the reward server
// killed and restarted mid-run.
#include "rollout/service.h"

#include <signal.h>

#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actor/checkpoint.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "common/grpc_status.h"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "proto/replay_buffer.grpc.pb.h"
#include "proto/rollout.grpc.pb.h"
#include "rollout/testing/tiny_model.h"
#include "weight_sync/weight_sync.h"

namespace rlmesh::rollout {
namespace {

using weight_sync::CreateWeightPublisher;
using weight_sync::NamedTensors;
using weight_sync::WeightSyncStore;

using ::rlmesh::testing::Runfile;
using ::rlmesh::testing::TempDir;
using testing::MakeRequest;
using testing::ReferenceGenerate;
using testing::WriteTinyCheckpoint;

struct StreamResult {
  std::vector<GenerateResponse> responses;
  absl::Status status;
  // Called after each response is read (index of it).
  std::function<void(size_t)> on_read;
};

StreamResult RunGenerate(const RpcClient& client, const GenerateRequest& req, absl::Duration timeout,
                         std::function<void(size_t)> on_read = nullptr) {
  StreamResult out;
  auto stub = RolloutService::NewStub(client.channel());
  auto ctx = client.NewContext(timeout);
  auto reader = stub->Generate(ctx.get(), req);
  GenerateResponse r;
  while (reader->Read(&r)) {
    out.responses.push_back(r);
    if (on_read) on_read(out.responses.size() - 1);
  }
  out.status = FromGrpcStatus(reader->Finish());
  return out;
}

const TrajectoryGroup* FindGroup(const StreamResult& s, const std::string& prompt_id) {
  for (const auto& r : s.responses) {
    if (r.group().prompt_id() == prompt_id) return &r.group();
  }
  return nullptr;
}

std::vector<int> Tokens(const Trajectory& t) { return {t.response_token_ids().begin(), t.response_token_ids().end()}; }

absl::Status LoadCheckpointRpc(const RpcClient& client, const std::string& path, int64_t version) {
  auto stub = RolloutService::NewStub(client.channel());
  LoadWeightsRequest req;
  req.set_checkpoint_path(path);
  req.set_version(version);
  LoadWeightsResponse resp;
  auto ctx = client.NewContext(absl::Seconds(30));
  return FromGrpcStatus(stub->LoadWeights(ctx.get(), req, &resp));
}

TEST_CASE("service: streamed generation equals actor/, errors keep their codes, auth is enforced") {
  TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  RolloutWorker worker({}, std::make_unique<actor::CharTokenizer>());
  ServerOptions so;
  so.auth_token = "sekrit";
  RpcServer server(so);
  RolloutServiceImpl service(&worker, &server.auth());
  server.AddService(&service);
  REQUIRE(server.Start().ok());
  ClientOptions co;
  co.auth_token = "sekrit";
  auto client = RpcClient::Create(server.address(), co);
  REQUIRE(client.ok());

  GenerateRequest req = MakeRequest({"12+3=", "abc", "q"}, 4, 10, 77);
  // No weights yet.
  CHECK(RunGenerate(*client, req, absl::Seconds(30)).status.code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(LoadCheckpointRpc(*client, dir.File("v1"), 0).ok());

  StreamResult s = RunGenerate(*client, req, absl::Seconds(60));
  REQUIRE(s.status.ok());
  REQUIRE(s.responses.size() == 3);
  auto ref = ReferenceGenerate(dir.File("v1"), req);
  REQUIRE(ref.ok());
  for (int p = 0; p < 3; ++p) {
    const TrajectoryGroup* g = FindGroup(s, "q" + std::to_string(p));
    REQUIRE(g != nullptr);
    REQUIRE(g->samples_size() == 4);
    for (int i = 0; i < 4; ++i) {
      std::vector<int> want((*ref)[p].samples[i].tokens.begin(), (*ref)[p].samples[i].tokens.end());
      CHECK(Tokens(g->samples(i)) == want);
      CHECK(g->samples(i).policy_version() == 1);
    }
  }
  for (const auto& r : s.responses) CHECK_FALSE(r.stored());

  // Bad input comes back as INVALID_ARGUMENT naming the field.
  GenerateRequest bad = req;
  bad.mutable_prompts(2)->set_token_ids(0, 9999);
  StreamResult b = RunGenerate(*client, bad, absl::Seconds(30));
  CHECK(b.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(b.status.message(), "prompts[2].token_ids[0]"));
  CHECK(b.responses.empty());

  // LoadWeights without a source, GetStatus.
  auto stub = RolloutService::NewStub((*client).channel());
  {
    LoadWeightsRequest lw;
    LoadWeightsResponse resp;
    auto ctx = client->NewContext(absl::Seconds(5));
    auto st = FromGrpcStatus(stub->LoadWeights(ctx.get(), lw, &resp));
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(st.message(), "source"));
  }
  {
    RolloutStatus st;
    auto ctx = client->NewContext(absl::Seconds(5));
    REQUIRE(stub->GetStatus(ctx.get(), RolloutStatusRequest(), &st).ok());
    CHECK(st.policy_version() == 1);
    CHECK(st.generated_tokens() == 3 * 4 * 10);
  }
  // Sleep: the weights go, Generate is refused until a load brings them
  // back, and the tokens are the same as before.
  {
    SleepRequest sr;
    sr.set_release_weights(true);
    SleepResponse resp;
    auto ctx = client->NewContext(absl::Seconds(30));
    REQUIRE(stub->Sleep(ctx.get(), sr, &resp).ok());
    CHECK(resp.released_bytes() > 0);
    CHECK(resp.memory_before_bytes() > 0);
    CHECK(resp.seconds() >= 0);
    RolloutStatus st;
    auto sctx = client->NewContext(absl::Seconds(5));
    REQUIRE(stub->GetStatus(sctx.get(), RolloutStatusRequest(), &st).ok());
    CHECK(st.weights_released());
  }
  StreamResult asleep = RunGenerate(*client, req, absl::Seconds(30));
  CHECK(asleep.status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(asleep.status.message(), "released by Sleep"));
  REQUIRE(LoadCheckpointRpc(*client, dir.File("v1"), 2).ok());
  StreamResult awake = RunGenerate(*client, req, absl::Seconds(60));
  REQUIRE(awake.status.ok());
  for (int p = 0; p < 3; ++p) {
    const TrajectoryGroup* g = FindGroup(awake, "q" + std::to_string(p));
    REQUIRE(g != nullptr);
    for (int i = 0; i < 4; ++i) {
      std::vector<int> want((*ref)[p].samples[i].tokens.begin(), (*ref)[p].samples[i].tokens.end());
      CHECK(Tokens(g->samples(i)) == want);
      CHECK(g->samples(i).policy_version() == 2);
    }
  }
  // Without the token: refused.
  auto anon = RpcClient::Create(server.address());
  REQUIRE(anon.ok());
  CHECK(RunGenerate(*anon, req, absl::Seconds(5)).status.code() == absl::StatusCode::kUnauthenticated);
  {
    auto anon_stub = RolloutService::NewStub(anon->channel());
    SleepResponse resp;
    auto ctx = anon->NewContext(absl::Seconds(5));
    CHECK(FromGrpcStatus(anon_stub->Sleep(ctx.get(), SleepRequest(), &resp)).code() ==
          absl::StatusCode::kUnauthenticated);
  }
  server.Shutdown();
}

// A rollout_worker process; killed by the destructor.
struct WorkerProcess {
  Subprocess proc;
  RpcClient client;
};

absl::StatusOr<std::pair<Subprocess, int>> StartBinary(const std::string& path, std::vector<std::string> args,
                                                       const std::string& port_file, const std::string& log) {
  std::vector<std::string> argv = {path, "--port_file=" + port_file};
  for (auto& a : args) argv.push_back(a);
  unlink(port_file.c_str());
  auto p = Subprocess::Start(argv, log);
  if (!p.ok()) return p.status();
  auto port = ReadPortFile(port_file, absl::Seconds(60));
  if (!port.ok()) return absl::UnavailableError(absl::StrCat(path, " did not report a port: ", port.status().message()));
  return std::make_pair(std::move(*p), *port);
}

TEST_CASE("Gloo weight update between two processes changes the output and bumps the version") {
  TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("v2"), 2).ok());
  auto started = StartBinary(Runfile("rollout/rollout_worker"),
                             {"--port=0", "--checkpoint=" + dir.File("v1"), "--threads=1"}, dir.File("port"),
                             dir.File("worker.log"));
  REQUIRE(started.ok());
  Subprocess proc = std::move(started->first);
  auto client = RpcClient::Create(absl::StrCat("127.0.0.1:", started->second));
  REQUIRE(client.ok());
  REQUIRE(WaitUntilServing(*client, absl::Seconds(30)).ok());
  auto stub = RolloutService::NewStub(client->channel());

  GenerateRequest req = MakeRequest({"abc", "7*8="}, 1, 12, 0);
  req.mutable_sampling()->set_greedy(true);
  StreamResult before = RunGenerate(*client, req, absl::Seconds(60));
  REQUIRE(before.status.ok());

  auto store = WeightSyncStore::Host("127.0.0.1", 0, 2, 30000);
  REQUIRE(store.ok());
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_GLOO);
  spec.set_store_host("127.0.0.1");
  spec.set_store_port((*store)->port());
  spec.set_world_size(2);
  spec.set_group_name("svc-gloo");
  spec.set_timeout_ms(30000);
  {
    ConfigureWeightSyncRequest cr;
    *cr.mutable_spec() = spec;
    cr.mutable_spec()->set_rank(1);
    ConfigureWeightSyncResponse cresp;
    auto ctx = client->NewContext(absl::Seconds(10));
    REQUIRE(stub->ConfigureWeightSync(ctx.get(), cr, &cresp).ok());
    CHECK(cresp.dtype() == "f32");  // what the publisher must send
  }
  auto v2 = actor::LoadHfModel(dir.File("v2"));
  REQUIRE(v2.ok());
  NamedTensors named;
  for (auto& [n, t] : (*v2)->NamedParameters()) named.emplace_back(n, t);

  // The coordinator's pattern: LoadWeights(sync = {version}) and the
  // learner's Publish at the same time.
  LoadWeightsResponse lresp;
  absl::Status lstatus;
  std::thread loader([&] {
    LoadWeightsRequest lr;
    lr.mutable_sync()->set_version(2);
    auto ctx = client->NewContext(absl::Seconds(60));
    lstatus = FromGrpcStatus(stub->LoadWeights(ctx.get(), lr, &lresp));
  });
  spec.set_rank(0);
  auto pub = CreateWeightPublisher(spec);
  REQUIRE(pub.ok());
  auto layout = (*pub)->Publish(named, 2);
  loader.join();
  REQUIRE(layout.ok());
  REQUIRE(lstatus.ok());
  CHECK(lresp.version() == 2);
  CHECK(lresp.bytes() > 0);

  StreamResult after = RunGenerate(*client, req, absl::Seconds(60));
  REQUIRE(after.status.ok());
  auto ref2 = ReferenceGenerate(dir.File("v2"), req);
  REQUIRE(ref2.ok());
  bool changed = false;
  for (int p = 0; p < 2; ++p) {
    const auto* a = FindGroup(after, "q" + std::to_string(p));
    const auto* b = FindGroup(before, "q" + std::to_string(p));
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    std::vector<int> want((*ref2)[p].samples[0].tokens.begin(), (*ref2)[p].samples[0].tokens.end());
    CHECK(Tokens(a->samples(0)) == want);
    CHECK(a->samples(0).policy_version() == 2);
    CHECK(b->samples(0).policy_version() == 1);
    changed |= Tokens(a->samples(0)) != Tokens(b->samples(0));
  }
  CHECK(changed);
  proc.Signal(SIGTERM);
  auto st = proc.Wait(absl::Seconds(5));
  REQUIRE(st.ok());
  CHECK(DescribeWaitStatus(*st) == "exit 0");
}

TEST_CASE("a weight sync stuck waiting for its publisher blocks no other call") {
  // A worker was once found that could not answer GetStatus for 15 s after a
  // burst of ConfigureWeightSync calls behind a LoadWeights(sync) whose
  // publisher never came: each call waited for the load inline, on the RPC
  // threads. Now they wait off those threads, bounded by their deadlines.
  TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  auto started = StartBinary(Runfile("rollout/rollout_worker"),
                             {"--port=0", "--checkpoint=" + dir.File("v1"), "--threads=1"}, dir.File("port"),
                             dir.File("worker.log"));
  REQUIRE(started.ok());
  Subprocess proc = std::move(started->first);
  auto client = RpcClient::Create(absl::StrCat("127.0.0.1:", started->second));
  REQUIRE(client.ok());
  REQUIRE(WaitUntilServing(*client, absl::Seconds(30)).ok());
  auto stub = RolloutService::NewStub(client->channel());

  // An in-process group in the worker's process: no publisher will ever
  // come, so the receive waits its full timeout (8 s).
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_IN_PROCESS);
  spec.set_group_name("nobody-publishes");
  spec.set_timeout_ms(8000);
  {
    ConfigureWeightSyncRequest cr;
    *cr.mutable_spec() = spec;
    ConfigureWeightSyncResponse cresp;
    auto ctx = client->NewContext(absl::Seconds(10));
    REQUIRE(stub->ConfigureWeightSync(ctx.get(), cr, &cresp).ok());
  }
  absl::Status load_status;
  std::thread loader([&] {
    LoadWeightsRequest lr;
    lr.mutable_sync()->set_version(5);
    LoadWeightsResponse lresp;
    auto ctx = client->NewContext(absl::Seconds(30));
    load_status = FromGrpcStatus(stub->LoadWeights(ctx.get(), lr, &lresp));
  });
  absl::SleepFor(absl::Milliseconds(500));  // the load now holds its turn

  // A burst of reconfigurations, each with a 1 s deadline.
  std::vector<std::thread> burst;
  std::vector<absl::Status> statuses(40);
  const absl::Time burst_start = absl::Now();
  for (int i = 0; i < 40; ++i) {
    burst.emplace_back([&, i] {
      ConfigureWeightSyncRequest cr;
      *cr.mutable_spec() = spec;
      cr.mutable_spec()->set_group_name("other-" + std::to_string(i));
      ConfigureWeightSyncResponse cresp;
      auto ctx = client->NewContext(absl::Seconds(1));
      statuses[i] = FromGrpcStatus(stub->ConfigureWeightSync(ctx.get(), cr, &cresp));
    });
  }
  absl::SleepFor(absl::Milliseconds(200));
  // Status and generation answer while all of that waits.
  for (int i = 0; i < 5; ++i) {
    RolloutStatusRequest sr;
    RolloutStatus status;
    auto ctx = client->NewContext(absl::Seconds(1));
    const absl::Time t0 = absl::Now();
    REQUIRE(stub->GetStatus(ctx.get(), sr, &status).ok());
    CHECK(absl::Now() - t0 < absl::Milliseconds(800));
  }
  GenerateRequest req = MakeRequest({"abc"}, 1, 4, 0);
  req.mutable_sampling()->set_greedy(true);
  CHECK(RunGenerate(*client, req, absl::Seconds(5)).status.ok());
  for (auto& t : burst) t.join();
  CHECK(absl::Now() - burst_start < absl::Seconds(5));
  for (const auto& st : statuses) {
    INFO(st.ToString());
    CHECK((st.code() == absl::StatusCode::kUnavailable || st.code() == absl::StatusCode::kDeadlineExceeded));
  }
  loader.join();
  CHECK(load_status.code() == absl::StatusCode::kDeadlineExceeded);  // the receive's own timeout
  proc.Signal(SIGTERM);
  auto st = proc.Wait(absl::Seconds(5));
  REQUIRE(st.ok());
  CHECK(DescribeWaitStatus(*st) == "exit 0");
}

TEST_CASE("pipeline through real reward_server and replay_buffer survives a reward server restart") {
  TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  auto rb = StartBinary(Runfile("replay_buffer/replay_buffer"), {"--port=0", "--db_path=" + dir.File("db")},
                        dir.File("rb.port"), dir.File("rb.log"));
  REQUIRE(rb.ok());
  auto rs = StartBinary(Runfile("reward_server/reward_server"), {"--port=0"}, dir.File("rs.port"),
                        dir.File("rs.log"));
  REQUIRE(rs.ok());
  const int reward_port = rs->second;
  Subprocess reward = std::move(rs->first);
  auto wk = StartBinary(Runfile("rollout/rollout_worker"),
                        {"--port=0", "--checkpoint=" + dir.File("v1"), "--threads=1", "--max_batch=4",
                         absl::StrCat("--reward_server=127.0.0.1:", reward_port),
                         absl::StrCat("--replay_buffer=127.0.0.1:", rb->second), "--name=rollout-7"},
                        dir.File("wk.port"), dir.File("wk.log"));
  REQUIRE(wk.ok());
  auto client = RpcClient::Create(absl::StrCat("127.0.0.1:", wk->second));
  REQUIRE(client.ok());
  REQUIRE(WaitUntilServing(*client, absl::Seconds(30)).ok());

  std::vector<std::string> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(absl::StrCat(i, "+", i, "="));
  GenerateRequest req = MakeRequest(prompts, 2, 30, 5);
  req.set_experiment_id("pipe");
  req.set_pipeline(true);
  VerifierConfig* v = req.add_verifiers();
  v->set_name("length");
  v->set_max_tokens(10);
  v->set_penalty_per_token(0.1);

  size_t read_before_restart = 0;
  bool restarted = false;
  absl::Status restart_status;
  StreamResult s = RunGenerate(*client, req, absl::Seconds(120), [&](size_t i) {
    if (i != 0 || restarted) return;
    // Kill the reward server after the first group, restart it on its port.
    read_before_restart = i + 1;
    reward.Signal(SIGKILL);
    (void)reward.Wait(absl::Seconds(5));
    absl::SleepFor(absl::Milliseconds(300));
    auto again = StartBinary(Runfile("reward_server/reward_server"), {absl::StrCat("--port=", reward_port)},
                             dir.File("rs2.port"), dir.File("rs2.log"));
    restart_status = again.status();
    if (again.ok()) reward = std::move(again->first);
    restarted = true;
  });
  REQUIRE(restarted);
  REQUIRE(restart_status.ok());
  INFO(s.status.ToString());
  REQUIRE(s.status.ok());
  REQUIRE(s.responses.size() == 12);  // no group lost
  CHECK(read_before_restart < 12);
  std::set<std::string> ids;
  for (const auto& r : s.responses) {
    CHECK(r.stored());
    ids.insert(r.group().group_id());
    for (const auto& t : r.group().samples()) {
      CHECK(t.reward_components().count("length") == 1);
      CHECK(t.scored_unix_micros() > 0);
      CHECK_FALSE(t.provenance().reward_source().empty());
      CHECK(t.provenance().rollout_worker() == "rollout-7");
      // 30 tokens against a 10-token target: penalised.
      const int over = t.response_token_ids_size() - 10;
      CHECK(t.reward() == Approx(over > 0 ? -0.1 * over : 0.0));
    }
  }
  CHECK(ids.size() == 12);

  auto rbc = RpcClient::Create(absl::StrCat("127.0.0.1:", rb->second));
  REQUIRE(rbc.ok());
  auto rstub = ReplayBuffer::NewStub(rbc->channel());
  StatsRequest sr;
  sr.set_experiment_id("pipe");
  StatsResponse stats;
  auto ctx = rbc->NewContext(absl::Seconds(10));
  REQUIRE(rstub->Stats(ctx.get(), sr, &stats).ok());
  REQUIRE(stats.experiments_size() == 1);
  CHECK(stats.experiments(0).groups() == 12);
  CHECK(stats.experiments(0).trajectories() == 24);

  RolloutStatus ws;
  auto wctx = client->NewContext(absl::Seconds(5));
  REQUIRE(RolloutService::NewStub(client->channel())->GetStatus(wctx.get(), RolloutStatusRequest(), &ws).ok());
  CHECK(ws.failed_groups() == 0);
}

}  // namespace
}  // namespace rlmesh::rollout
