#include "reward_server/reward_model.h"

#include <sys/wait.h>

#include <fstream>
#include <iterator>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "actor/checkpoint.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "proto/reward.grpc.pb.h"
#include "reward_server/scorer.h"
#include "reward_server/service.h"

namespace rlmesh {
namespace {

actor::ModelConfig TinyConfig() {
  actor::CharTokenizer tok;
  actor::ModelConfig c;
  c.vocab_size = tok.vocab_size();
  c.hidden_size = 32;
  c.intermediate_size = actor::DefaultIntermediateSize(32);
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 64;
  c.value_head = true;
  return c;
}

// Writes a seeded tiny reward model into `dir`. The head is scaled up so
// scores differ visibly between items.
void WriteTinyModel(const std::string& dir, uint64_t seed, bool value_head = true) {
  at::manual_seed(seed);
  actor::ModelConfig c = TinyConfig();
  c.value_head = value_head;
  actor::Transformer m(c);
  if (value_head) {
    at::NoGradGuard no_grad;
    m->score->weight.mul_(25.0);
  }
  REQUIRE(actor::SaveHfModel(m, dir).ok());
}

// The reference: the model's value at the last token, one item alone, no
// padding, no mask.
double DirectScore(actor::Transformer& m, const RewardModelItem& item) {
  c10::InferenceMode guard;
  std::vector<int64_t> ids(item.prompt_ids.begin(), item.prompt_ids.end());
  ids.insert(ids.end(), item.completion_ids.begin(), item.completion_ids.end());
  const int64_t T = static_cast<int64_t>(ids.size());
  at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
  at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0);
  return m->Values(input, pos)[0][T - 1].item<double>();
}

RewardModelItem Item(const actor::Tokenizer& tok, const std::string& prompt, const std::string& completion) {
  return RewardModelItem{tok.Encode(prompt), tok.Encode(completion)};
}

std::vector<RewardModelItem> VariedItems(const actor::Tokenizer& tok) {
  return {Item(tok, "12+30=", "42"), Item(tok, "7*8=", "56 because seven eights"), Item(tok, "1+1=", "2"),
          Item(tok, "", "only a completion"), Item(tok, "a long prompt with many characters in it ", ""),
          Item(tok, "9-4=", "5")};
}

TEST_CASE("batched, padded scores equal the model's value for each item alone") {
  testing::TempDir dir;
  WriteTinyModel(dir.path(), 7);
  actor::CharTokenizer tok;
  auto direct = actor::LoadHfModel(dir.path());
  REQUIRE(direct.ok());
  RewardModelOptions o;
  o.max_batch = 8;
  o.max_wait = absl::Milliseconds(20);
  auto rm = RewardModel::Load(dir.path(), o);
  REQUIRE(rm.ok());
  const auto items = VariedItems(tok);
  auto scores = (*rm)->Score(items);
  REQUIRE(scores.ok());
  REQUIRE(scores->size() == items.size());
  double spread = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const double want = DirectScore(*direct, items[i]);
    CHECK(std::abs((*scores)[i] - want) < 1e-5);
    spread = std::max(spread, std::abs((*scores)[i] - (*scores)[0]));
  }
  CHECK(spread > 1e-3);  // the items really score differently
  // All six went through one forward pass (one call, max_batch 8).
  CHECK((*rm)->stats().batches == 1);
  CHECK((*rm)->stats().items_run == 6);
  CHECK((*rm)->stats().passes >= 2);  // lengths 5..41 are cut into length buckets

  // max_batch 2 splits the same call into three passes with the same scores.
  RewardModelOptions small = o;
  small.max_batch = 2;
  auto rm2 = RewardModel::Load(dir.path(), small);
  REQUIRE(rm2.ok());
  auto scores2 = (*rm2)->Score(items);
  REQUIRE(scores2.ok());
  for (size_t i = 0; i < items.size(); ++i) CHECK(std::abs((*scores2)[i] - (*scores)[i]) < 1e-5);
  CHECK((*rm2)->stats().batches == 3);
}

TEST_CASE("concurrent callers are merged into batches") {
  testing::TempDir dir;
  WriteTinyModel(dir.path(), 11);
  actor::CharTokenizer tok;
  auto direct = actor::LoadHfModel(dir.path());
  REQUIRE(direct.ok());
  RewardModelOptions o;
  o.max_batch = 16;
  o.max_wait = absl::Milliseconds(20);
  auto rm = RewardModel::Load(dir.path(), o);
  REQUIRE(rm.ok());
  constexpr int kThreads = 8;
  std::vector<RewardModelItem> items;
  for (int i = 0; i < kThreads; ++i) items.push_back(Item(tok, std::to_string(i) + "+" + std::to_string(i) + "=", std::to_string(2 * i)));
  std::vector<double> got(kThreads, -1e9);
  std::vector<absl::Status> status(kThreads);
  std::vector<std::thread> threads;
  absl::Mutex mu;
  int arrived = 0;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      {
        // Start together (bounded wait).
        absl::MutexLock l(&mu);
        ++arrived;
        auto all = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return arrived == kThreads; };
        mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(10));
      }
      auto s = (*rm)->Score({items[t]});
      status[t] = s.status();
      if (s.ok()) got[t] = (*s)[0];
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    REQUIRE(status[t].ok());
    CHECK(std::abs(got[t] - DirectScore(*direct, items[t])) < 1e-5);
  }
  const RewardModelStats st = (*rm)->stats();
  CHECK(st.items_run == kThreads);
  CHECK(st.batches < kThreads);
  CHECK(st.mean_batch_size() > 1.0);
}

TEST_CASE("a call past its deadline is DEADLINE_EXCEEDED and its queued items are dropped, not run") {
  testing::TempDir dir;
  WriteTinyModel(dir.path(), 12);
  actor::CharTokenizer tok;
  RewardModelOptions o;
  o.max_batch = 64;
  o.max_wait = absl::Seconds(1);  // the batcher waits this long for batch mates
  auto rm = RewardModel::Load(dir.path(), o);
  REQUIRE(rm.ok());
  const absl::Time t0 = absl::Now();
  auto late = (*rm)->Score({Item(tok, "1+2=", "3")}, absl::Now() + absl::Milliseconds(100));
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - t0 < absl::Milliseconds(800));
  // The next call is batched after the abandoned item's wait; only it runs.
  auto next = (*rm)->Score({Item(tok, "2+2=", "4")});
  REQUIRE(next.ok());
  const RewardModelStats st = (*rm)->stats();
  CHECK(st.timeouts == 1);
  CHECK(st.items_dropped == 1);
  CHECK(st.items_run == 1);
}

TEST_CASE("a repeated item is a cache hit with the same score; the cache is bounded (LRU)") {
  testing::TempDir dir;
  WriteTinyModel(dir.path(), 3);
  actor::CharTokenizer tok;
  RewardModelOptions o;
  o.max_wait = absl::ZeroDuration();
  o.cache_size = 2;
  auto rm = RewardModel::Load(dir.path(), o);
  REQUIRE(rm.ok());
  const RewardModelItem a = Item(tok, "1+2=", "3"), b = Item(tok, "2+2=", "4"), c = Item(tok, "3+2=", "5");
  // Same ids, split differently between prompt and completion: not the same item.
  const RewardModelItem a_split = Item(tok, "1+2", "=3");
  auto first = (*rm)->Score({a});
  REQUIRE(first.ok());
  CHECK((*rm)->stats().cache_hits == 0);
  auto again = (*rm)->Score({b, a});
  REQUIRE(again.ok());
  CHECK((*again)[1] == (*first)[0]);
  CHECK((*rm)->stats().cache_hits == 1);
  CHECK((*rm)->stats().items_run == 2);
  // LRU order is now [b, a] (b was stored after a was read): a_split evicts a.
  REQUIRE((*rm)->Score({a_split}).ok());
  CHECK((*rm)->stats().cache_hits == 1);
  CHECK((*rm)->stats().items_run == 3);
  REQUIRE((*rm)->Score({c}).ok());  // evicts b
  REQUIRE((*rm)->Score({a}).ok());  // evicted: runs again
  CHECK((*rm)->stats().cache_hits == 1);
  CHECK((*rm)->stats().items_run == 5);
  auto c_again = (*rm)->Score({c});
  REQUIRE(c_again.ok());
  CHECK((*rm)->stats().cache_hits == 2);
  CHECK((*rm)->stats().items_run == 5);

  // cache_size 0: nothing is ever a hit.
  o.cache_size = 0;
  auto uncached = RewardModel::Load(dir.path(), o);
  REQUIRE(uncached.ok());
  REQUIRE((*uncached)->Score({a, a}).ok());
  REQUIRE((*uncached)->Score({a}).ok());
  CHECK((*uncached)->stats().cache_hits == 0);
  CHECK((*uncached)->stats().items_run == 3);
}

TEST_CASE("missing, corrupt or head-less folders and bad items are clear errors") {
  testing::TempDir dir;
  const std::string missing = dir.File("no_such_model");
  auto r = RewardModel::Load(missing);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find(missing) != absl::string_view::npos);

  const std::string corrupt = dir.File("corrupt");
  WriteTinyModel(corrupt, 1);
  std::ofstream(corrupt + "/model.safetensors", std::ios::trunc) << "not a safetensors file";
  r = RewardModel::Load(corrupt);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find(corrupt) != absl::string_view::npos);

  const std::string policy = dir.File("policy");
  WriteTinyModel(policy, 1, /*value_head=*/false);
  r = RewardModel::Load(policy);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find(policy) != absl::string_view::npos);
  CHECK(r.status().message().find("score.weight") != absl::string_view::npos);

  RewardModelOptions bad;
  bad.max_batch = 0;
  CHECK(bad.Validate().message().find("max_batch") != absl::string_view::npos);

  const std::string good = dir.File("good");
  WriteTinyModel(good, 1);
  auto rm = RewardModel::Load(good);
  REQUIRE(rm.ok());
  actor::CharTokenizer tok;
  auto s = (*rm)->Score({Item(tok, "1", "2"), RewardModelItem{{1}, {100000}}});
  CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.status().message().find("items[1].completion_token_ids") != absl::string_view::npos);
  s = (*rm)->Score({RewardModelItem{}});
  CHECK(s.status().message().find("items[0]") != absl::string_view::npos);
  s = (*rm)->Score({RewardModelItem{std::vector<int>(65, 1), {}}});
  CHECK(s.status().message().find("positions") != absl::string_view::npos);
  CHECK((*rm)->stats().items_run == 0);  // nothing ran for a bad request
}

TEST_CASE("the gRPC Score path returns the reward_model component, weighted") {
  testing::TempDir dir;
  WriteTinyModel(dir.path(), 5);
  actor::CharTokenizer tok;
  auto direct = actor::LoadHfModel(dir.path());
  REQUIRE(direct.ok());
  auto rm = RewardModel::Load(dir.path());
  REQUIRE(rm.ok());
  ScorerOptions so;
  so.reward_model = rm->get();
  so.reward_model_weight = 0.5;
  auto scorer = RewardScorer::Create(so, &tok);
  REQUIRE(scorer.ok());
  RpcServer server(ServerOptions{});
  RewardServiceImpl service(&server.auth(), scorer->get());
  server.AddService(&service);
  REQUIRE(server.Start().ok());
  auto client = RpcClient::Create(server.address());
  REQUIRE(client.ok());
  auto stub = RewardService::NewStub(client->channel());

  ScoreRequest req;
  const std::vector<std::pair<std::string, std::string>> pc = {{"20+22=", "42"}, {"20+22=", "41"}};
  for (const auto& [p, c] : pc) {
    ScoreItem* item = req.add_items();
    for (int id : tok.Encode(p)) item->add_prompt_token_ids(id);
    for (int id : tok.Encode(c)) item->add_completion_token_ids(id);
    item->set_reference_answer("42");
  }
  VerifierConfig numeric;
  numeric.set_name("numeric_answer");
  *req.add_verifiers() = numeric;
  ScoreResponse resp;
  auto ctx = client->NewContext(absl::Seconds(30));
  grpc::Status st = stub->Score(ctx.get(), req, &resp);
  REQUIRE(st.ok());
  REQUIRE(resp.results_size() == 2);
  CHECK(resp.reward_source() == "verifiers:numeric_answer+reward_model");
  for (int i = 0; i < 2; ++i) {
    const double want = DirectScore(*direct, Item(tok, pc[i].first, pc[i].second));
    const auto& comps = resp.results(i).components();
    REQUIRE(comps.count("reward_model") == 1);
    CHECK(std::abs(comps.at("reward_model") - want) < 1e-5);
    CHECK(resp.results(i).reward() == Approx(comps.at("numeric_answer") + 0.5 * comps.at("reward_model")));
  }
  CHECK(resp.results(0).components().at("numeric_answer") == 1.0);

  // The same request again is answered from the cache; status reports it.
  ScoreResponse again;
  auto ctx2 = client->NewContext(absl::Seconds(30));
  REQUIRE(stub->Score(ctx2.get(), req, &again).ok());
  CHECK(again.results(1).components().at("reward_model") == resp.results(1).components().at("reward_model"));
  RewardStatus status;
  auto ctx3 = client->NewContext(absl::Seconds(30));
  REQUIRE(stub->GetStatus(ctx3.get(), RewardStatusRequest{}, &status).ok());
  CHECK(status.cache_hits() == 2);
  CHECK(status.mean_batch_size() == Approx(2.0));
  CHECK(status.scored_items() == 4);

  // With the model and no verifiers anywhere, the model alone scores.
  ScorerOptions rm_only;
  rm_only.reward_model = rm->get();
  auto only = RewardScorer::Create(rm_only, &tok);
  REQUIRE(only.ok());
  ScoreRequest plain = req;
  plain.clear_verifiers();
  auto r = (*only)->Score(plain);
  REQUIRE(r.ok());
  CHECK(r->reward_source() == "reward_model");
  CHECK(r->results(0).reward() == r->results(0).components().at("reward_model"));
  CHECK(r->results(0).components().size() == 1);

  // A bad id through the scorer is INVALID_ARGUMENT naming the item.
  ScoreRequest bad = plain;
  bad.mutable_items(1)->add_prompt_token_ids(tok.vocab_size() + 5);
  auto b = (*only)->Score(bad);
  CHECK(b.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(b.status().message().find("items[1].prompt_token_ids") != absl::string_view::npos);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_CASE("the reward_server binary loads the experiment's reward model, and a bad folder stops it") {
  testing::TempDir dir;
  const std::string model = dir.File("rm");
  WriteTinyModel(model, 9);
  auto direct = actor::LoadHfModel(model);
  REQUIRE(direct.ok());
  const std::string yaml = dir.File("exp.yaml");
  std::ofstream(yaml) << "name: rm_test\nreward:\n  reward_model: " << model << "\n  reward_model_weight: 2.0\n"
                      << "  verifiers: [{name: numeric_answer, weight: 1.0}]\n";
  const std::string bin = testing::Runfile("reward_server/reward_server");
  auto server = Subprocess::Start({bin, "--port=0", "--port_file=" + dir.File("port"), "--experiment=" + yaml,
                                   "--rm_max_wait_ms=1", "--threads=1"},
                                  dir.File("server.log"));
  REQUIRE(server.ok());
  auto port = ReadPortFile(dir.File("port"), absl::Seconds(60));
  if (!port.ok()) FAIL("reward_server did not start: " << ReadAll(dir.File("server.log")));
  auto client = RpcClient::Create("127.0.0.1:" + std::to_string(*port));
  REQUIRE(client.ok());
  auto stub = RewardService::NewStub(client->channel());
  actor::CharTokenizer tok;
  ScoreRequest req;
  ScoreItem* item = req.add_items();
  for (int id : tok.Encode("3+4=")) item->add_prompt_token_ids(id);
  for (int id : tok.Encode("7")) item->add_completion_token_ids(id);
  item->set_reference_answer("7");
  ScoreResponse resp;
  auto ctx = client->NewContext(absl::Seconds(30));
  REQUIRE(stub->Score(ctx.get(), req, &resp).ok());
  REQUIRE(resp.results_size() == 1);
  const double want = DirectScore(*direct, Item(tok, "3+4=", "7"));
  CHECK(std::abs(resp.results(0).components().at("reward_model") - want) < 1e-5);
  CHECK(resp.results(0).reward() == Approx(1.0 + 2.0 * want));
  server->Stop(absl::Seconds(5));

  const std::string missing = dir.File("not_a_model");
  auto bad = Subprocess::Start({bin, "--port=0", "--reward_model=" + missing}, dir.File("bad.log"));
  REQUIRE(bad.ok());
  auto status = bad->Wait(absl::Seconds(60));
  REQUIRE(status.ok());
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 2);
  CHECK(ReadAll(dir.File("bad.log")).find(missing) != std::string::npos);
}

}  // namespace
}  // namespace rlmesh
