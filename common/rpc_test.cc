// The RPC plumbing through a real server on loopback: port 0 and port files,
// health, deadlines, token auth and TLS.
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/rpc_client.h"
#include "common/rpc_handler.h"
#include "common/rpc_server.h"
#include "common/testing/test_util.h"
#include "proto/reward.grpc.pb.h"

namespace rlmesh {
namespace {

// A tiny RewardService: reward = completion length; a completion of token
// -1 sleeps 2 s (to exercise deadlines).
class LengthReward final : public RewardService::CallbackService {
 public:
  explicit LengthReward(const ServerAuth* auth) : auth_(auth) {}
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* ctx, const ScoreRequest* req,
                                  ScoreResponse* resp) override {
    return HandleUnary(ctx, *auth_, [&]() -> absl::Status {
      for (const auto& item : req->items()) {
        if (!item.completion_token_ids().empty() && item.completion_token_ids(0) == -1) {
          slow_started.fetch_add(1);
          std::this_thread::sleep_for(std::chrono::seconds(2));
          slow_done.fetch_add(1);
        }
        auto* r = resp->add_results();
        r->set_item_id(item.item_id());
        r->set_reward(item.completion_token_ids_size());
      }
      return absl::OkStatus();
    });
  }

  // Slow (token -1) handlers that have begun / returned from their sleep.
  std::atomic<int> slow_started{0};
  std::atomic<int> slow_done{0};

 private:
  const ServerAuth* auth_;
};

absl::StatusOr<double> ScoreOne(const RpcClient& client, int tokens,
                                absl::Duration timeout = absl::Seconds(5)) {
  auto stub = RewardService::NewStub(client.channel());
  ScoreRequest req;
  auto* item = req.add_items();
  for (int i = 0; i < tokens; ++i) item->add_completion_token_ids(tokens < 0 ? -1 : i);
  if (tokens < 0) item->add_completion_token_ids(-1);
  ScoreResponse resp;
  auto ctx = client.NewContext(timeout);
  grpc::Status s = stub->Score(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.results(0).reward();
}

struct Fixture {
  explicit Fixture(ServerOptions options) : server(std::move(options)), service(&server.auth()) {
    server.AddService(&service);
  }
  RpcServer server;
  LengthReward service;
};

TEST_CASE("port 0 binds loopback, writes the port file and serves health") {
  testing::TempDir dir;
  ServerOptions opts;
  opts.port_file = dir.File("port");
  Fixture f(opts);
  REQUIRE(f.server.Start().ok());
  REQUIRE(f.server.port() > 0);
  CHECK(f.server.address() == "127.0.0.1:" + std::to_string(f.server.port()));
  std::ifstream in(dir.File("port"));
  int written = 0;
  in >> written;
  CHECK(written == f.server.port());

  auto client = RpcClient::Create(f.server.address());
  REQUIRE(client.ok());
  auto health = CheckHealth(*client, absl::Seconds(5));
  REQUIRE(health.ok());
  CHECK(*health == "SERVING");
  CHECK(*ScoreOne(*client, 3) == 3);
}

TEST_CASE("a port in use is a clear error") {
  Fixture a(ServerOptions{});
  REQUIRE(a.server.Start().ok());
  ServerOptions opts;
  opts.port = a.server.port();
  Fixture b(opts);
  absl::Status s = b.server.Start();
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find(std::to_string(a.server.port())) != std::string::npos);
}

TEST_CASE("bad options are rejected by name") {
  ServerOptions opts;
  opts.port = 70000;
  CHECK(opts.Validate().message().find("port") != absl::string_view::npos);
  ServerOptions tls;
  tls.tls_cert_file = "x.pem";
  CHECK(tls.Validate().message().find("tls_key_file") != absl::string_view::npos);
}

TEST_CASE("every client call carries a deadline") {
  Fixture f(ServerOptions{});
  REQUIRE(f.server.Start().ok());
  auto client = RpcClient::Create(f.server.address());
  REQUIRE(client.ok());
  auto ctx = client->NewContext(absl::Seconds(3));
  auto left = ctx->deadline() - std::chrono::system_clock::now();
  CHECK(left > std::chrono::seconds(2));
  CHECK(left <= std::chrono::seconds(3));
  // A slow handler past the deadline is DEADLINE_EXCEEDED, not a hang.
  auto slow = ScoreOne(*client, -1, absl::Milliseconds(200));
  CHECK(slow.status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("token auth rejects calls without the right token") {
  ServerOptions opts;
  opts.auth_token = "s3cret";
  Fixture f(opts);
  REQUIRE(f.server.Start().ok());

  auto anonymous = RpcClient::Create(f.server.address());
  REQUIRE(anonymous.ok());
  CHECK(ScoreOne(*anonymous, 2).status().code() == absl::StatusCode::kUnauthenticated);

  ClientOptions wrong;
  wrong.auth_token = "s3creT";
  auto bad = RpcClient::Create(f.server.address(), wrong);
  CHECK(ScoreOne(*bad, 2).status().code() == absl::StatusCode::kUnauthenticated);

  ClientOptions right;
  right.auth_token = "s3cret";
  auto good = RpcClient::Create(f.server.address(), right);
  auto score = ScoreOne(*good, 2);
  REQUIRE(score.ok());
  CHECK(*score == 2);
}

TEST_CASE("credential files: a missing, empty or blank file is named, a server with an empty certificate does not start") {
  testing::TempDir dir;
  std::ofstream(dir.File("empty.pem")).flush();
  std::ofstream(dir.File("blank.token")) << "  \n";
  std::ofstream(dir.File("ok.token")) << " secret\n";
  auto missing = ReadCredentialFile(dir.File("nope.pem"), "TLS key");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message() == "cannot read TLS key file " + dir.File("nope.pem"));
  auto empty = ReadCredentialFile(dir.File("empty.pem"), "TLS certificate");
  CHECK(empty.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(empty.status().message() == "TLS certificate file " + dir.File("empty.pem") + " is empty");
  CHECK(ReadTokenFile(dir.File("blank.token")).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(*ReadTokenFile(dir.File("ok.token")) == "secret");
  CHECK(ReadTokenFile("")->empty());

  ServerOptions options;
  options.port = 0;
  options.tls_cert_file = dir.File("empty.pem");
  options.tls_key_file = dir.File("empty.pem");
  RpcServer server(options);
  absl::Status started = server.Start();
  CHECK(started.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(started.message(), "TLS certificate file"));
}

TEST_CASE("TLS: a client trusting the certificate connects, a plaintext one does not") {
  testing::TempDir dir;
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      dir.File("key.pem") + " -out " + dir.File("cert.pem") + " >/dev/null 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);

  ServerOptions opts;
  opts.tls_cert_file = dir.File("cert.pem");
  opts.tls_key_file = dir.File("key.pem");
  Fixture f(opts);
  REQUIRE(f.server.Start().ok());

  ClientOptions tls;
  tls.tls.root_cert_file = dir.File("cert.pem");
  tls.tls.server_name = "localhost";
  auto secure = RpcClient::Create("localhost:" + std::to_string(f.server.port()), tls);
  REQUIRE(secure.ok());
  auto score = ScoreOne(*secure, 4);
  REQUIRE(score.ok());
  CHECK(*score == 4);

  auto plain = RpcClient::Create(f.server.address());
  CHECK_FALSE(ScoreOne(*plain, 4, absl::Seconds(2)).ok());
}

// The certificates of scripts/make_test_certs.sh (a data dependency).
std::string MakeCerts(const testing::TempDir& dir) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string script = std::string(srcdir == nullptr ? "." : srcdir) + "/" +
                             (workspace == nullptr ? "rlmesh" : workspace) + "/scripts/make_test_certs.sh";
  const std::string cmd = "bash " + script + " " + dir.File("certs") + " >/dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  return dir.File("certs") + "/";
}

TEST_CASE("mutual TLS: only a client with a certificate from the trusted CA and the token gets in") {
  testing::TempDir dir;
  const std::string c = MakeCerts(dir);
  ServerOptions opts;
  opts.auth_token = "tok";
  opts.tls_cert_file = c + "node.pem";
  opts.tls_key_file = c + "node.key";
  opts.tls_client_ca_file = c + "ca.pem";
  Fixture f(opts);
  REQUIRE(f.server.Start().ok());
  const std::string address = "127.0.0.1:" + std::to_string(f.server.port());

  auto call = [&](const ClientOptions& o) {
    auto client = RpcClient::Create(address, o);
    REQUIRE(client.ok());
    return ScoreOne(*client, 5, absl::Seconds(3)).status();
  };
  ClientOptions good;
  good.auth_token = "tok";
  good.tls = {c + "ca.pem", c + "node.pem", c + "node.key", ""};
  CHECK(call(good).ok());

  ClientOptions no_cert = good;  // verifies the server but presents nothing
  no_cert.tls.cert_file.clear();
  no_cert.tls.key_file.clear();
  CHECK(call(no_cert).code() == absl::StatusCode::kUnavailable);

  ClientOptions rogue = good;  // a certificate the server's CA did not sign
  rogue.tls.cert_file = c + "rogue.pem";
  rogue.tls.key_file = c + "rogue.key";
  CHECK(call(rogue).code() == absl::StatusCode::kUnavailable);

  ClientOptions wrong_root = good;  // cannot verify the server
  wrong_root.tls.root_cert_file = c + "rogue-ca.pem";
  CHECK(call(wrong_root).code() == absl::StatusCode::kUnavailable);

  ClientOptions no_token = good;  // TLS is not a substitute for the token
  no_token.auth_token.clear();
  CHECK(call(no_token).code() == absl::StatusCode::kUnauthenticated);

  ClientOptions plain;
  plain.auth_token = "tok";
  CHECK_FALSE(call(plain).ok());

  // A client that names no TLS uses the process's (what a role's --tls_*
  // flags set), so every channel of a role is verified the same way.
  SetProcessClientTls(good.tls);
  CHECK(call(plain).ok());
  SetProcessClientTls({});
  CHECK_FALSE(call(plain).ok());

  // Half a client certificate is refused by name, not sent.
  ClientOptions half = good;
  half.tls.key_file.clear();
  auto refused = RpcClient::Create(address, half);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  // Mutual TLS without a server certificate is refused at Start.
  ServerOptions bad;
  bad.tls_client_ca_file = c + "ca.pem";
  RpcServer server(bad);
  CHECK(server.Start().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("shutdown finishes within its grace period") {
  ServerOptions opts;
  opts.shutdown_grace = absl::Milliseconds(200);
  Fixture f(opts);
  REQUIRE(f.server.Start().ok());
  auto client = RpcClient::Create(f.server.address());
  std::thread slow([&] { (void)ScoreOne(*client, -1, absl::Seconds(10)); });
  // Shut down only once the slow handler is running, so the grace period
  // has something to cut short.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (f.service.slow_started.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(f.service.slow_started.load() == 1);
  const absl::Time start = absl::Now();
  f.server.Shutdown();
  // The handler sleeps 2 s; Shutdown must not wait for it... beyond the
  // grace period plus the handler's own return (it cannot be interrupted).
  CHECK(absl::Now() - start < absl::Seconds(3));
  slow.join();
}

TEST_CASE("concurrent Shutdown calls each return only once the server has stopped") {
  ServerOptions opts;
  opts.shutdown_grace = absl::Milliseconds(100);
  Fixture f(opts);
  REQUIRE(f.server.Start().ok());
  auto client = RpcClient::Create(f.server.address());
  REQUIRE(client.ok());
  std::thread slow([&] { (void)ScoreOne(*client, -1, absl::Seconds(10)); });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (f.service.slow_started.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(f.service.slow_started.load() == 1);
  // Stopping waits for the sleeping handler, so a caller that returns
  // earlier (a second caller skipping the wait) sees slow_done == 0.
  std::vector<int> done_at_return(3, -1);
  std::vector<std::thread> stoppers;
  for (int i = 0; i < 3; ++i) {
    stoppers.emplace_back([&, i] {
      f.server.Shutdown();
      done_at_return[i] = f.service.slow_done.load();
    });
  }
  for (auto& t : stoppers) t.join();
  for (int d : done_at_return) CHECK(d == 1);
  slow.join();
}

}  // namespace
}  // namespace rlmesh
