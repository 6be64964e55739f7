#include "reward_server/scorer.h"


#include <fstream>
#include <thread>

#include "catch2/catch.hpp"
#include "common/rpc_server.h"
#include "common/testing/script.h"
#include "common/testing/test_util.h"
#include "reward_server/client.h"
#include "reward_server/service.h"
#include "reward_server/testing/gated_verifier.h"

namespace rlmesh {
namespace {

VerifierConfig V(const std::string& name, double weight) {
  VerifierConfig c;
  c.set_name(name);
  c.set_weight(weight);
  return c;
}

// Threads of this process, from /proc/self/status.
int ProcessThreads() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

ScoreItem Item(const actor::Tokenizer& tok, const std::string& completion, const std::string& answer) {
  ScoreItem item;
  item.set_item_id(completion);
  for (int id : tok.Encode(completion)) item.add_completion_token_ids(id);
  item.set_reference_answer(answer);
  return item;
}

TEST_CASE("token ids are decoded and weighted components summed") {
  actor::CharTokenizer tok;
  ScorerOptions o;
  auto scorer = RewardScorer::Create(o, &tok);
  REQUIRE(scorer.ok());
  ScoreRequest req;
  *req.add_items() = Item(tok, "46", "46");
  *req.add_items() = Item(tok, "47", "46");
  *req.add_verifiers() = V("numeric_answer", 1.0);
  VerifierConfig len = V("length", 0.5);
  len.set_max_tokens(1);
  len.set_penalty_per_token(1.0);
  *req.add_verifiers() = len;
  auto resp = (*scorer)->Score(req);
  REQUIRE(resp.ok());
  REQUIRE(resp->results_size() == 2);
  CHECK(resp->results(0).completion_text() == "46");
  CHECK(resp->results(0).components().at("numeric_answer") == 1.0);
  CHECK(resp->results(0).components().at("length") == -1.0);
  CHECK(resp->results(0).reward() == Approx(1.0 - 0.5));
  CHECK(resp->results(1).reward() == Approx(0.0 - 0.5));
  CHECK(resp->reward_source() == "verifiers:numeric_answer+length");
  CHECK((*scorer)->GetStatus().scored_items() == 2);
}

TEST_CASE("bad items are INVALID_ARGUMENT naming the item") {
  actor::CharTokenizer tok;
  auto scorer = RewardScorer::Create(ScorerOptions{}, &tok);
  ScoreRequest req;
  *req.add_items() = Item(tok, "1", "1");
  req.add_items()->add_completion_token_ids(100000);
  auto r = (*scorer)->Score(req);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("items[1].completion_token_ids") != absl::string_view::npos);

  auto no_tok = RewardScorer::Create(ScorerOptions{}, nullptr);
  ScoreRequest ids_only;
  ids_only.add_items()->add_completion_token_ids(5);
  CHECK((*no_tok)->Score(ids_only).status().message().find("items[0].completion_text") != absl::string_view::npos);
}

TEST_CASE("a verifier past its deadline is counted and does not stall the batch") {
  const testing::GatedVerifier slow;  // never opened
  auto scorer = slow.MakeScorer();
  REQUIRE(scorer.ok());
  ScoreRequest req;
  for (int i = 0; i < 8; ++i) *req.add_items() = Item(slow.tokenizer(), std::to_string(i), "3");
  *req.add_verifiers() = V("numeric_answer", 1.0);
  *req.add_verifiers() = slow.Config();
  req.set_verifier_timeout_ms(300);
  const absl::Time start = absl::Now();
  auto resp = (*scorer)->Score(req);
  REQUIRE(resp.ok());
  CHECK(absl::Now() - start < absl::Seconds(3));  // one deadline for the batch, not eight
  CHECK(resp->results(3).reward() == 1.0);         // the verifier that finished still counts
  CHECK(resp->results(3).timed_out_size() == 1);
  CHECK(resp->results(3).timed_out(0) == "command");
  CHECK((*scorer)->GetStatus().verifier_timeouts() == 8);
}

TEST_CASE("when every verifier thread is stuck the verifier queue fills and requests are refused") {
  const testing::GatedVerifier slow;  // never opened
  ScorerOptions options;
  options.verifier_threads = 2;
  options.verifier_queue = 2;
  auto scorer = slow.MakeScorer(options);
  REQUIRE(scorer.ok());
  auto request = [&](int items, absl::Duration timeout) {
    ScoreRequest req;
    for (int i = 0; i < items; ++i) *req.add_items() = Item(slow.tokenizer(), std::to_string(i), "3");
    *req.add_verifiers() = slow.Config();
    req.set_verifier_timeout_ms(absl::ToInt64Milliseconds(timeout));
    return req;
  };
  // More calls than the pool could ever hold: a refusal retrying cannot fix.
  auto too_big = (*scorer)->Score(request(5, absl::Seconds(1)));
  CHECK(too_big.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(too_big.status().message().find("5 blocking verifier calls") != absl::string_view::npos);

  // Four calls fill both threads and the queue until their deadline.
  const int idle_threads = ProcessThreads();
  absl::StatusOr<ScoreResponse> held;
  std::thread holder([&] { held = (*scorer)->Score(request(4, absl::Seconds(3))); });
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while ((*scorer)->blocking_calls_held() < 4 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  REQUIRE((*scorer)->blocking_calls_held() == 4);
  CHECK(ProcessThreads() == idle_threads + 1);  // the holder; no thread per call
  auto probe = (*scorer)->Score(request(1, absl::Seconds(1)));
  CHECK(probe.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(probe.status().message() ==
        "reward server busy: all 2 verifier_threads busy and 2 blocking verifier calls queued (verifier_queue); "
        "retry later");
  holder.join();
  REQUIRE(held.ok());
  // The two that waited had passed their deadline when a thread came free:
  // all four are timed out, and the pool takes calls again.
  for (const ScoreResult& r : held->results()) CHECK(r.timed_out_size() == 1);
  auto after = (*scorer)->Score(request(1, absl::Milliseconds(1)));
  CHECK(after.ok());
}

TEST_CASE("a request may run only the programs the server allows or was started with") {
  testing::TempDir dir;
  const std::string listed = testing::WriteScript(dir, "listed.sh", "echo 0.5");
  const std::string configured = testing::WriteScript(dir, "configured.sh", "echo 0.25");
  const std::string stranger = testing::WriteScript(dir, "stranger.sh", "echo 1");
  actor::CharTokenizer tok;
  ScorerOptions options;
  options.allowed_commands = {listed};
  VerifierConfig own = V("command", 1.0);
  own.add_command(configured);
  options.default_verifiers = {own};
  auto scorer = RewardScorer::Create(options, &tok);
  REQUIRE(scorer.ok());
  auto run = [&](const std::string& program) {
    ScoreRequest req;
    *req.add_items() = Item(tok, "1", "1");
    *req.add_verifiers() = V("numeric_answer", 1.0);
    VerifierConfig cmd = V("command", 1.0);
    cmd.add_command(program);
    *req.add_verifiers() = cmd;
    req.set_verifier_timeout_ms(5000);
    return (*scorer)->Score(req);
  };
  auto ok = run(listed);
  REQUIRE(ok.ok());
  CHECK(ok->results(0).reward() == 1.5);
  auto own_program = run(configured);  // the server's own verifier's program
  REQUIRE(own_program.ok());
  CHECK(own_program->results(0).reward() == 1.25);
  auto refused = run(stranger);
  CHECK(refused.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(refused.status().message().find("verifiers[1].command: '" + stranger + "'") != absl::string_view::npos);
  // The request's defaults path (no verifiers named) runs the server's own.
  ScoreRequest defaults;
  *defaults.add_items() = Item(tok, "1", "1");
  auto d = (*scorer)->Score(defaults);
  REQUIRE(d.ok());
  CHECK(d->results(0).reward() == 0.25);
  // An empty name in the list is refused when the server starts.
  ScorerOptions empty;
  empty.allowed_commands = {""};
  CHECK(RewardScorer::Create(empty, &tok).status().message().find("allowed_commands") != absl::string_view::npos);
}

TEST_CASE("served over gRPC with auth, through the retrying client") {
  actor::CharTokenizer tok;
  auto scorer = RewardScorer::Create(ScorerOptions{}, &tok);
  ServerOptions so;
  so.auth_token = "tok";
  RpcServer server(so);
  RewardServiceImpl service(&server.auth(), scorer->get());
  server.AddService(&service);
  REQUIRE(server.Start().ok());
  ClientOptions co;
  co.auth_token = "tok";
  auto client = MakeGrpcRewardClient(*RpcClient::Create(server.address(), co));
  ScoreRequest req;
  *req.add_items() = Item(tok, "12", "12");
  auto resp = client->Score(req, absl::InfiniteDuration());
  REQUIRE(resp.ok());
  CHECK(resp->results(0).reward() == 1.0);

  RetryOptions quick;
  quick.total_timeout = absl::Seconds(1);
  auto anonymous = MakeGrpcRewardClient(*RpcClient::Create(server.address()), quick);
  CHECK(anonymous->Score(req, absl::InfiniteDuration()).status().code() == absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace rlmesh
