// The Learner service through a real in-process gRPC server (status codes,
// field-naming errors, step checks, buffer sampling with acks), and the
// learner binary killed with SIGKILL mid-stage resuming bit-exactly.
#include "learner/service.h"

#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/grpc_status.h"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "learner/checkpoint.h"

namespace rlmesh::learner {
namespace {

ExperimentConfig Tiny() {
  ExperimentConfig e;
  e.set_name("svc");
  e.set_seed(5);
  auto* m = e.mutable_model();
  m->set_hidden(32);
  m->set_layers(2);
  m->set_heads(2);
  m->set_max_positions(32);
  e.mutable_task()->set_digits(1);
  e.mutable_task()->set_train(10);
  e.mutable_task()->set_eval(4);
  return e;
}

ExperimentConfig TinySft(int steps) {
  ExperimentConfig e = Tiny();
  auto* sft = e.add_stages()->mutable_sft();
  sft->set_steps(steps);
  sft->set_batch(4);
  sft->mutable_optimizer()->set_lr(3e-3);
  return e;
}

class FakeSource : public GroupSource {
 public:
  absl::StatusOr<Sampled> Sample(const BufferSource& source, int num_groups, absl::Duration) override {
    last_num_groups = num_groups;
    last_consumer = source.consumer_id();
    Sampled s;
    for (int g = 0; g < num_groups; ++g) {
      TrajectoryGroup grp;
      for (int i = 0; i < 2; ++i) {
        Trajectory* t = grp.add_samples();
        for (int id : {1, 10, 20, 11}) t->add_prompt_token_ids(id);
        for (int id : {12, 2}) t->add_response_token_ids(id);
        t->set_reward(i);
      }
      s.groups.push_back(grp);
    }
    s.ack_token = "tok-" + std::to_string(++samples);
    return s;
  }
  absl::Status Ack(const BufferSource&, const std::string& token) override {
    acked.push_back(token);
    return absl::OkStatus();
  }
  int samples = 0;
  int last_num_groups = 0;
  std::string last_consumer;
  std::vector<std::string> acked;
};

struct Server {
  explicit Server(const std::string& token = "") {
    ServerOptions options;
    options.auth_token = token;
    server = std::make_unique<RpcServer>(options);
    service = std::make_unique<LearnerService>(&trainer, &server->auth());
    server->AddService(service.get());
    REQUIRE(server->Start().ok());
    ClientOptions co;
    co.auth_token = token;
    co.default_timeout = absl::Seconds(60);
    auto c = RpcClient::Create(server->address(), co);
    REQUIRE(c.ok());
    client = std::make_unique<RpcClient>(*std::move(c));
    stub = Learner::NewStub(client->channel());
  }
  ~Server() {
    server->Shutdown();
    service.reset();
  }
  Trainer trainer;
  std::unique_ptr<RpcServer> server;
  std::unique_ptr<LearnerService> service;
  std::unique_ptr<RpcClient> client;
  std::unique_ptr<Learner::Stub> stub;
};

ConfigureRequest Configure(const ExperimentConfig& e, const std::string& dir) {
  ConfigureRequest r;
  *r.mutable_experiment() = e;
  r.set_world_size(1);
  r.set_checkpoint_dir(dir);
  return r;
}

grpc::Status Call(Learner::Stub& stub, const RpcClient& c, const ConfigureRequest& req,
                  ConfigureResponse* resp) {
  auto ctx = c.NewContext();
  return stub.Configure(ctx.get(), req, resp);
}

grpc::Status Step(Learner::Stub& stub, const RpcClient& c, int64_t step, TrainStepResponse* resp) {
  TrainStepRequest req;
  req.set_step(step);
  req.set_from_task(true);
  auto ctx = c.NewContext();
  return stub.TrainStep(ctx.get(), req, resp);
}

TEST_CASE("service: configure, train, wrong step, save, status, errors naming fields") {
  rlmesh::testing::TempDir dir;
  Server s;
  TrainStepResponse tr;
  // Not configured yet.
  CHECK(Step(*s.stub, *s.client, 0, &tr).error_code() == grpc::StatusCode::FAILED_PRECONDITION);

  ExperimentConfig bad = TinySft(3);
  bad.mutable_stages(0)->mutable_sft()->mutable_optimizer()->set_lr(0);
  ConfigureResponse cr;
  grpc::Status st = Call(*s.stub, *s.client, Configure(bad, ""), &cr);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("experiment.stages[0].sft.optimizer.lr") != std::string::npos);

  ConfigureRequest bad_rank = Configure(TinySft(3), "");
  bad_rank.set_rank(2);
  st = Call(*s.stub, *s.client, bad_rank, &cr);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("rank") != std::string::npos);

  ExperimentConfig bad_model = TinySft(3);
  bad_model.mutable_model()->set_heads(3);  // does not divide hidden 32
  st = Call(*s.stub, *s.client, Configure(bad_model, ""), &cr);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("experiment.model") != std::string::npos);

  REQUIRE(Call(*s.stub, *s.client, Configure(TinySft(3), dir.File("ckpt")), &cr).ok());
  CHECK(cr.step() == 0);
  REQUIRE(Step(*s.stub, *s.client, 0, &tr).ok());
  CHECK(tr.policy_version() == 1);
  for (const char* k : {"loss", "grad_norm", "lr", "tokens", "tokens_per_second",
                        "seconds_forward_backward", "seconds_optimizer"}) {
    CHECK(tr.metrics().values().count(k) == 1);
  }
  // A retried step is not applied twice.
  st = Step(*s.stub, *s.client, 0, &tr);
  CHECK(st.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(st.error_message().find("expected 1") != std::string::npos);

  SaveResponse sr;
  {
    auto ctx = s.client->NewContext();
    REQUIRE(s.stub->Save(ctx.get(), SaveRequest(), &sr).ok());
  }
  CHECK(sr.path() == dir.File("ckpt") + "/step_000001");
  CHECK(sr.step() == 1);
  CHECK(VerifyCheckpoint(sr.path()).ok());

  LearnerStatus status;
  {
    auto ctx = s.client->NewContext();
    REQUIRE(s.stub->GetStatus(ctx.get(), LearnerStatusRequest(), &status).ok());
  }
  CHECK(status.stage() == "sft");
  CHECK(status.step() == 1);
  CHECK(status.policy_version() == 1);
  CHECK(status.world_size() == 1);

  // PublishWeights with an invalid spec is refused, not crashed.
  PublishWeightsRequest pw;
  pw.mutable_spec()->set_bucket_mb(-1);
  PublishWeightsResponse pr;
  {
    auto ctx = s.client->NewContext();
    CHECK_FALSE(s.stub->PublishWeights(ctx.get(), pw, &pr).ok());
  }
}

grpc::Status HostStore(Server& s, int* port) {
  HostStoreResponse resp;
  auto ctx = s.client->NewContext();
  grpc::Status st = s.stub->HostStore(ctx.get(), HostStoreRequest(), &resp);
  *port = resp.port();
  return st;
}

TEST_CASE("service: two shards rendezvous in the store shard 0 hosts, a new prefix per configuration") {
  Server s0, s1;
  int port = 0, again = 0;
  REQUIRE(HostStore(s0, &port).ok());
  CHECK(port > 0);
  REQUIRE(HostStore(s0, &again).ok());
  CHECK(again == port);  // one store for the life of the process

  // Both shards configure at once (the rendezvous needs both) and train one
  // step; data parallelism makes their losses and weights agree.
  auto configure_both = [&](const std::string& address, const std::string& prefix, grpc::Status* st0,
                            grpc::Status* st1) {
    auto one = [&](Server& s, int rank, grpc::Status* st) {
      ConfigureRequest req = Configure(TinySft(2), "");
      req.set_world_size(2);
      req.set_rank(rank);
      req.set_store_address(address);
      req.set_store_prefix(prefix);
      ConfigureResponse cr;
      *st = Call(*s.stub, *s.client, req, &cr);
    };
    std::thread t1([&] { one(s1, 1, st1); });
    one(s0, 0, st0);
    t1.join();
  };
  const std::string address = absl::StrCat("127.0.0.1:", port);
  for (const char* prefix : {"exp/learners/0-sft/0", "exp/learners/0-sft/1"}) {
    INFO(prefix);
    grpc::Status st0, st1;
    configure_both(address, prefix, &st0, &st1);
    REQUIRE(st0.ok());
    REQUIRE(st1.ok());
    TrainStepResponse r0, r1;
    grpc::Status t0;
    std::thread t([&] { t0 = Step(*s1.stub, *s1.client, 0, &r1); });
    REQUIRE(Step(*s0.stub, *s0.client, 0, &r0).ok());
    t.join();
    REQUIRE(t0.ok());
    CHECK(r0.metrics().values().at("grad_norm") == r1.metrics().values().at("grad_norm"));
  }

  // A store address that is neither file:PATH nor host:port is refused by name.
  ConfigureRequest bad = Configure(TinySft(2), "");
  bad.set_world_size(2);
  bad.set_store_address("no-port-here");
  ConfigureResponse cr;
  grpc::Status st = Call(*s0.stub, *s0.client, bad, &cr);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("store_address") != std::string::npos);
}

TEST_CASE("service: auth is checked on every method") {
  Server s("secret");
  ClientOptions co;
  co.auth_token = "wrong";
  auto c = RpcClient::Create(s.server->address(), co);
  REQUIRE(c.ok());
  auto stub = Learner::NewStub(c->channel());
  ConfigureResponse cr;
  CHECK(Call(*stub, *c, Configure(TinySft(3), ""), &cr).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  TrainStepResponse tr;
  CHECK(Step(*stub, *c, 0, &tr).error_code() == grpc::StatusCode::UNAUTHENTICATED);
}

TEST_CASE("service: GRPO step samples its slice from the buffer and acks it") {
  Server s;
  FakeSource source;
  s.service->set_group_source_for_test(&source);
  ExperimentConfig e = Tiny();
  auto* rl = e.add_stages()->mutable_grpo()->mutable_rl();
  rl->set_steps(2);
  rl->set_prompts_per_step(4);
  rl->mutable_optimizer()->set_lr(1e-3);
  ConfigureResponse cr;
  REQUIRE(Call(*s.stub, *s.client, Configure(e, ""), &cr).ok());
  TrainStepRequest req;
  req.set_step(0);
  req.mutable_buffer()->set_experiment_id("svc");
  req.mutable_buffer()->set_consumer_id("learner");
  req.mutable_buffer()->set_num_groups(3);
  TrainStepResponse tr;
  {
    auto ctx = s.client->NewContext();
    REQUIRE(s.stub->TrainStep(ctx.get(), req, &tr).ok());
  }
  CHECK(source.last_num_groups == 3);
  CHECK(source.last_consumer == "learner");
  REQUIRE(source.acked.size() == 1);
  CHECK(source.acked[0] == "tok-1");
  CHECK(tr.metrics().values().at("reward_mean") == 0.5);
  CHECK(tr.metrics().values().at("ratio_mean") == 1.0);
  // A bad inline group names its field.
  TrainStepRequest bad;
  bad.set_step(1);
  auto* g = bad.mutable_groups()->add_groups();
  auto* t = g->add_samples();
  t->add_prompt_token_ids(1);
  t->add_response_token_ids(5);
  t->add_loss_mask(1);
  t->add_loss_mask(1);
  auto ctx = s.client->NewContext();
  grpc::Status st = s.stub->TrainStep(ctx.get(), bad, &tr);
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(st.error_message().find("groups[0].samples[0].loss_mask") != std::string::npos);
}

// A learner process, driven over gRPC.
struct Proc {
  Proc(const std::string& dir, const std::string& tag) {
    const std::string port_file = dir + "/port-" + tag;
    auto p = Subprocess::Start({rlmesh::testing::Runfile("learner/learner"), "--port=0",
                                "--port_file=" + port_file, "--threads=1"},
                               dir + "/log-" + tag);
    REQUIRE(p.ok());
    proc = std::make_unique<Subprocess>(*std::move(p));
    auto port = ReadPortFile(port_file, absl::Seconds(30));
    REQUIRE(port.ok());
    ClientOptions co;
    co.default_timeout = absl::Seconds(60);
    auto c = RpcClient::Create(absl::StrCat("127.0.0.1:", *port), co);
    REQUIRE(c.ok());
    client = std::make_unique<RpcClient>(*std::move(c));
    stub = Learner::NewStub(client->channel());
  }
  std::string Save() {
    SaveResponse sr;
    auto ctx = client->NewContext();
    grpc::Status st = stub->Save(ctx.get(), SaveRequest(), &sr);
    REQUIRE(st.ok());
    return sr.path();
  }
  std::unique_ptr<Subprocess> proc;
  std::unique_ptr<RpcClient> client;
  std::unique_ptr<Learner::Stub> stub;
};

TEST_CASE("learner binary: SIGKILL mid-stage, restart, resume gives bit-identical weights") {
  rlmesh::testing::TempDir dir;
  const int N = 6;
  ExperimentConfig e = TinySft(N);
  std::string straight_path;
  {
    Proc p(dir.path(), "straight");
    ConfigureResponse cr;
    REQUIRE(Call(*p.stub, *p.client, Configure(e, dir.File("straight")), &cr).ok());
    TrainStepResponse tr;
    for (int i = 0; i < N; ++i) REQUIRE(Step(*p.stub, *p.client, i, &tr).ok());
    straight_path = p.Save();
  }
  {
    Proc p(dir.path(), "killed");
    ConfigureResponse cr;
    REQUIRE(Call(*p.stub, *p.client, Configure(e, dir.File("resumed")), &cr).ok());
    TrainStepResponse tr;
    for (int i = 0; i < N / 2; ++i) REQUIRE(Step(*p.stub, *p.client, i, &tr).ok());
    p.Save();
    REQUIRE(Step(*p.stub, *p.client, N / 2, &tr).ok());  // lost with the process
    p.proc->Signal(SIGKILL);
    auto w = p.proc->Wait(absl::Seconds(10));
    REQUIRE(w.ok());
  }
  std::string resumed_path;
  {
    Proc p(dir.path(), "resumed");
    ConfigureResponse cr;
    REQUIRE(Call(*p.stub, *p.client, Configure(e, dir.File("resumed")), &cr).ok());
    CHECK(cr.step() == N / 2);
    TrainStepResponse tr;
    for (int i = N / 2; i < N; ++i) REQUIRE(Step(*p.stub, *p.client, i, &tr).ok());
    resumed_path = p.Save();
    CHECK(p.proc->Stop(absl::Seconds(5)) == 0);
  }
  auto a = VerifyCheckpoint(straight_path);
  auto b = VerifyCheckpoint(resumed_path);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->files.at("model.safetensors").sha256 == b->files.at("model.safetensors").sha256);
  CHECK(a->files.at("optimizer.safetensors").sha256 == b->files.at("optimizer.safetensors").sha256);
  CHECK(a->step == b->step);
  CHECK(a->loader_index == b->loader_index);
}

}  // namespace
}  // namespace rlmesh::learner
