// The ReplayBuffer service through a real in-process gRPC server on loopback:
// every method end to end, auth, status codes, deadlines and streaming export.
#include "replay_buffer/service.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/grpc_status.h"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

TrajectoryGroup MakeGroup(const std::string& exp, int64_t step, const std::string& gid,
                          std::vector<double> rewards, int response_tokens = 3) {
  TrajectoryGroup g;
  g.set_experiment_id(exp);
  g.set_step(step);
  g.set_group_id(gid);
  g.set_prompt_id("p-" + gid);
  for (size_t j = 0; j < rewards.size(); ++j) {
    Trajectory* t = g.add_samples();
    t->set_trajectory_id(absl::StrCat(exp, "/", gid, "/", j));
    t->set_sample_index(j);
    t->set_policy_version(1);
    t->set_reward(rewards[j]);
    for (int k = 0; k < response_tokens; ++k) {
      t->add_response_token_ids(k);
      t->add_loss_mask(1);
      t->add_behaviour_logprobs(-1.0f);
    }
  }
  return g;
}

struct Server {
  explicit Server(const std::string& token = "") {
    ReplayStoreOptions so;
    so.db_path = dir.File("db");
    auto s = ReplayStore::Open(so);
    REQUIRE(s.ok());
    store = *std::move(s);
    ServerOptions options;
    options.auth_token = token;
    server = std::make_unique<RpcServer>(options);
    service = std::make_unique<ReplayBufferService>(store.get(), &server->auth());
    server->AddService(service.get());
    REQUIRE(server->Start().ok());
    ClientOptions co;
    co.auth_token = token;
    auto c = RpcClient::Create(server->address(), co);
    REQUIRE(c.ok());
    client = std::make_unique<RpcClient>(*std::move(c));
    stub = ReplayBuffer::NewStub(client->channel());
  }
  ~Server() {
    server->Shutdown();
    service.reset();
  }
  testing::TempDir dir;
  std::unique_ptr<ReplayStore> store;
  std::unique_ptr<RpcServer> server;
  std::unique_ptr<ReplayBufferService> service;
  std::unique_ptr<RpcClient> client;
  std::unique_ptr<ReplayBuffer::Stub> stub;
};

grpc::Status Put(Server& s, std::vector<TrajectoryGroup> groups, PutGroupsResponse* resp) {
  PutGroupsRequest req;
  for (auto& g : groups) *req.add_groups() = std::move(g);
  auto ctx = s.client->NewContext(absl::Seconds(10));
  return s.stub->PutGroups(ctx.get(), req, resp);
}

TEST_CASE("put, sample, ack, query, stats, trim over gRPC") {
  Server s;
  PutGroupsResponse put;
  REQUIRE(Put(s, {MakeGroup("e", 0, "a", {0, 1}), MakeGroup("e", 1, "b", {1, 1})}, &put).ok());
  CHECK(put.written() == 2);
  REQUIRE(Put(s, {MakeGroup("e", 0, "a", {0, 1})}, &put).ok());
  CHECK(put.duplicates() == 1);

  SampleGroupsRequest sreq;
  sreq.set_experiment_id("e");
  sreq.set_consumer_id("L");
  sreq.set_num_groups(2);
  sreq.set_require_ack(true);
  SampleGroupsResponse sresp;
  auto ctx = s.client->NewContext(absl::Seconds(5));
  REQUIRE(s.stub->SampleGroups(ctx.get(), sreq, &sresp).ok());
  REQUIRE(sresp.groups_size() == 2);
  CHECK(sresp.groups(0).group_id() == "a");
  CHECK(sresp.groups(0).samples_size() == 2);
  AckSampleRequest ack;
  ack.set_experiment_id("e");
  ack.set_consumer_id("L");
  ack.set_ack_token(sresp.ack_token());
  AckSampleResponse ackr;
  ctx = s.client->NewContext(absl::Seconds(5));
  REQUIRE(s.stub->AckSample(ctx.get(), ack, &ackr).ok());

  QueryRequest q;
  q.mutable_filter()->set_experiment_id("e");
  q.set_limit(3);
  q.set_with_aggregates(true);
  QueryResponse qr;
  ctx = s.client->NewContext(absl::Seconds(5));
  REQUIRE(s.stub->Query(ctx.get(), q, &qr).ok());
  CHECK(qr.trajectories_size() == 3);
  CHECK(!qr.next_page_token().empty());
  CHECK(qr.aggregates_size() == 2);

  StatsResponse st;
  ctx = s.client->NewContext(absl::Seconds(5));
  REQUIRE(s.stub->Stats(ctx.get(), StatsRequest(), &st).ok());
  REQUIRE(st.experiments_size() == 1);
  CHECK(st.experiments(0).groups() == 2);
  CHECK(st.experiments(0).consumed().at("L") == 2);

  TrimRequest t;
  t.set_experiment_id("e");
  t.set_keep_steps(1);
  TrimResponse tr;
  ctx = s.client->NewContext(absl::Seconds(5));
  REQUIRE(s.stub->Trim(ctx.get(), t, &tr).ok());
  CHECK(tr.groups_removed() == 1);
}

TEST_CASE("bad input and unknown experiments map to INVALID_ARGUMENT over the wire") {
  Server s;
  PutGroupsResponse put;
  auto bad = MakeGroup("e", 0, "a", {0, 1});
  bad.mutable_samples(1)->add_loss_mask(0);
  grpc::Status st = Put(s, {bad}, &put);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("groups[0].samples[1].loss_mask") != std::string::npos);
  QueryRequest q;
  q.mutable_filter()->set_experiment_id("e");  // nothing was written
  QueryResponse qr;
  auto ctx = s.client->NewContext(absl::Seconds(5));
  st = s.stub->Query(ctx.get(), q, &qr);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("experiment_id") != std::string::npos);
}

TEST_CASE("a sample that cannot be satisfied ends before the client's deadline, consuming nothing") {
  Server s;
  PutGroupsResponse put;
  REQUIRE(Put(s, {MakeGroup("e", 0, "a", {0, 1})}, &put).ok());
  SampleGroupsRequest sreq;
  sreq.set_experiment_id("e");
  sreq.set_consumer_id("L");
  sreq.set_num_groups(2);
  SampleGroupsResponse sresp;
  auto ctx = s.client->NewContext(absl::Milliseconds(500));
  const absl::Time t0 = absl::Now();
  grpc::Status st = s.stub->SampleGroups(ctx.get(), sreq, &sresp);
  CHECK(st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server's own answer (it names what was missing), not the client's timer.
  CHECK(st.error_message().find("nothing consumed") != std::string::npos);
  CHECK(absl::Now() - t0 < absl::Seconds(2));
  // A writer arriving while a sampler waits wakes it.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    PutGroupsResponse p2;
    CHECK(Put(s, {MakeGroup("e", 1, "b", {0, 1})}, &p2).ok());
  });
  ctx = s.client->NewContext(absl::Seconds(10));
  st = s.stub->SampleGroups(ctx.get(), sreq, &sresp);
  writer.join();
  REQUIRE(st.ok());
  CHECK(sresp.groups_size() == 2);
  CHECK(sresp.groups(0).group_id() == "a");
}

TEST_CASE("export streams JSONL in chunks") {
  Server s;
  PutGroupsResponse put;
  std::vector<TrajectoryGroup> groups;
  // ~40 KB of tokens per group: 30 groups make several 1 MiB chunks.
  for (int i = 0; i < 30; ++i) groups.push_back(MakeGroup("e", i, absl::StrCat("g", i), {0, 1}, 5000));
  REQUIRE(Put(s, groups, &put).ok());
  ExportRequest ex;
  ex.mutable_filter()->set_experiment_id("e");
  auto ctx = s.client->NewContext(absl::Seconds(20));
  auto reader = s.stub->Export(ctx.get(), ex);
  ExportChunk chunk;
  int chunks = 0, records = 0, lines = 0;
  while (reader->Read(&chunk)) {
    ++chunks;
    records += chunk.records();
    for (char c : chunk.jsonl()) lines += c == '\n';
  }
  REQUIRE(reader->Finish().ok());
  CHECK(records == 60);
  CHECK(lines == 60);
  CHECK(chunks >= 2);
}

TEST_CASE("with a token configured, calls without it are UNAUTHENTICATED") {
  Server s("sekrit");
  auto anon = RpcClient::Create(s.server->address());
  REQUIRE(anon.ok());
  auto stub = ReplayBuffer::NewStub(anon->channel());
  StatsResponse st;
  auto ctx = anon->NewContext(absl::Seconds(5));
  CHECK(stub->Stats(ctx.get(), StatsRequest(), &st).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  PutGroupsRequest req;
  *req.add_groups() = MakeGroup("e", 0, "a", {1});
  PutGroupsResponse pr;
  ctx = anon->NewContext(absl::Seconds(5));
  CHECK(stub->PutGroups(ctx.get(), req, &pr).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  ExportRequest ex;
  ex.mutable_filter()->set_experiment_id("e");
  ctx = anon->NewContext(absl::Seconds(5));
  auto reader = stub->Export(ctx.get(), ex);
  ExportChunk chunk;
  while (reader->Read(&chunk)) {
  }
  CHECK(reader->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED);
  // Nothing was written by the rejected put.
  ctx = s.client->NewContext(absl::Seconds(5));
  REQUIRE(s.stub->Stats(ctx.get(), StatsRequest(), &st).ok());
  CHECK(st.experiments_size() == 0);
}

}  // namespace
}  // namespace rlmesh
