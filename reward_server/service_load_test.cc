// Load on a reward server past its limits: 10x score_queue concurrent Score
// calls whose verifier blocks until the test releases it. The server must
// accept exactly score_threads + score_queue of them, answer the rest
// RESOURCE_EXHAUSTED at once, and hold the process's threads and memory
// flat while it does.

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "proto/reward.grpc.pb.h"
#include "reward_server/client.h"
#include "reward_server/scorer.h"
#include "reward_server/service.h"
#include "reward_server/testing/gated_verifier.h"

namespace rlmesh {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(60);

// Threads and VmRSS (KiB) of this process, from /proc/self/status.
struct ProcUsage {
  int threads = 0;
  int64_t rss_kib = 0;
};

ProcUsage ReadProcUsage() {
  ProcUsage u;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "Threads:") fields >> u.threads;
    if (key == "VmRSS:") fields >> u.rss_kib;
  }
  return u;
}

// Records the highest thread count and RSS seen, every millisecond, on one
// thread of its own (started before any baseline is taken).
class PeakSampler {
 public:
  PeakSampler() : thread_([this] { Run(); }) {}
  ~PeakSampler() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  // Forgets the peaks so far.
  void Reset() {
    absl::MutexLock lock(&mu_);
    peak_ = ReadProcUsage();
  }
  ProcUsage peak() {
    absl::MutexLock lock(&mu_);
    return peak_;
  }

 private:
  void Run() {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(1))) {
      const ProcUsage now = ReadProcUsage();
      peak_.threads = std::max(peak_.threads, now.threads);
      peak_.rss_kib = std::max(peak_.rss_kib, now.rss_kib);
    }
  }

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  ProcUsage peak_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Outcomes of asynchronous Score calls, counted as they complete.
class Outcomes {
 public:
  void Add(const grpc::Status& s) {
    absl::MutexLock lock(&mu_);
    if (s.ok()) {
      ++ok_;
    } else if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused_;
      last_refusal_ = s.error_message();
    } else {
      ++other_;
      last_other_ = s.error_message();
    }
  }
  // Waits until `n` calls have completed, or `timeout`; whether they have.
  bool WaitForCompleted(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ok_ + refused_ + other_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  int ok() {
    absl::MutexLock lock(&mu_);
    return ok_;
  }
  int refused() {
    absl::MutexLock lock(&mu_);
    return refused_;
  }
  int other() {
    absl::MutexLock lock(&mu_);
    return other_;
  }
  std::string last_refusal() {
    absl::MutexLock lock(&mu_);
    return last_refusal_;
  }
  std::string last_other() {
    absl::MutexLock lock(&mu_);
    return last_other_;
  }

 private:
  absl::Mutex mu_;
  int ok_ ABSL_GUARDED_BY(mu_) = 0;
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
  int other_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_refusal_ ABSL_GUARDED_BY(mu_);
  std::string last_other_ ABSL_GUARDED_BY(mu_);
};

// One asynchronous call's state, alive until its callback has run.
struct AsyncCall {
  std::unique_ptr<grpc::ClientContext> ctx;
  ScoreRequest request;
  ScoreResponse response;
};

ScoreRequest SlowRequest(const testing::GatedVerifier& slow, const std::string& answer) {
  ScoreRequest req;
  ScoreItem* item = req.add_items();
  item->set_item_id(answer);
  item->set_completion_text(answer);
  item->set_reference_answer(answer);
  *req.add_verifiers() = slow.Config();
  req.set_verifier_timeout_ms(absl::ToInt64Milliseconds(kDeadline));
  return req;
}

TEST_CASE("10x score_queue concurrent calls: the excess is refused at once, threads and memory stay flat") {
  constexpr int kScoreThreads = 4;
  constexpr int kScoreQueue = 8;
  constexpr int kCalls = 10 * kScoreQueue;
  constexpr int kAccepted = kScoreThreads + kScoreQueue;
  // Fixed bounds over the idle server's figures. Each accepted call that
  // runs holds one verifier thread of the pool; gRPC may add a few threads
  // of its own under load. A thread per call would add kCalls or more.
  constexpr int kMaxExtraThreads = 16;
  constexpr int64_t kMaxExtraRssKib = 64 << 10;

  // Prints 1 once the test opens its gate.
  const testing::GatedVerifier slow;
  ScorerOptions so;
  so.verifier_threads = kScoreThreads;
  so.verifier_queue = kScoreQueue;
  auto scorer = slow.MakeScorer(so);
  REQUIRE(scorer.ok());
  RpcServer server(ServerOptions{});
  RewardServiceOptions options;
  options.score_threads = kScoreThreads;
  options.score_queue = kScoreQueue;
  REQUIRE(options.Validate().ok());
  RewardServiceImpl service(&server.auth(), scorer->get(), options);
  server.AddService(&service);
  REQUIRE(server.Start().ok());
  auto client = RpcClient::Create(server.address());
  REQUIRE(client.ok());
  auto stub = RewardService::NewStub(client->channel());

  PeakSampler sampler;
  // A first call brings up the channel and gRPC's threads on both ends.
  {
    ScoreRequest warm;
    ScoreItem* item = warm.add_items();
    item->set_completion_text("1");
    item->set_reference_answer("1");
    ScoreResponse resp;
    auto ctx = client->NewContext(kDeadline);
    REQUIRE(stub->Score(ctx.get(), warm, &resp).ok());
  }
  // Its pool slot frees just after its answer goes out.
  const absl::Time settle = absl::Now() + kDeadline;
  while (service.score_calls_held() > 0 && absl::Now() < settle) absl::SleepFor(absl::Milliseconds(1));
  REQUIRE(service.score_calls_held() == 0);
  const ProcUsage idle = ReadProcUsage();
  sampler.Reset();

  Outcomes outcomes;
  std::vector<std::unique_ptr<AsyncCall>> calls;
  for (int i = 0; i < kCalls; ++i) {
    auto call = std::make_unique<AsyncCall>();
    call->ctx = client->NewContext(kDeadline);
    call->request = SlowRequest(slow, std::to_string(i));
    stub->async()->Score(call->ctx.get(), &call->request, &call->response,
                         [&outcomes](grpc::Status s) { outcomes.Add(s); });
    calls.push_back(std::move(call));
  }
  // The excess is answered while the accepted calls still wait on the gate.
  const bool refusals_in = outcomes.WaitForCompleted(kCalls - kAccepted, absl::Seconds(10));
  const ProcUsage loaded = sampler.peak();
  slow.Open();
  const bool all_in = outcomes.WaitForCompleted(kCalls, kDeadline);
  if (!all_in) {
    // The calls' state must outlive them: cancel what is left and wait.
    for (const auto& call : calls) call->ctx->TryCancel();
    outcomes.WaitForCompleted(kCalls, kDeadline);
  }
  REQUIRE(all_in);
  const ProcUsage peak = sampler.peak();

  INFO("idle threads=" << idle.threads << " rss_kib=" << idle.rss_kib << "; peak while held threads="
                       << loaded.threads << " rss_kib=" << loaded.rss_kib << "; peak overall threads="
                       << peak.threads << " rss_kib=" << peak.rss_kib << "; ok=" << outcomes.ok()
                       << " refused=" << outcomes.refused() << " other=" << outcomes.other() << " ("
                       << outcomes.last_other() << ")");
  CHECK(refusals_in);
  CHECK(outcomes.refused() == kCalls - kAccepted);
  CHECK(outcomes.ok() == kAccepted);
  CHECK(outcomes.other() == 0);
  CHECK(outcomes.last_refusal() ==
        "reward server busy: all 4 score_threads busy and 8 Score calls queued (score_queue); retry later");
  CHECK(peak.threads <= idle.threads + kMaxExtraThreads);
  CHECK(peak.rss_kib <= idle.rss_kib + kMaxExtraRssKib);
  for (const auto& call : calls) {
    if (call->response.results_size() == 0) continue;  // refused
    CHECK(call->response.results(0).reward() == 1.0);
  }
  CHECK((*scorer)->GetStatus().scored_items() == 1 + kAccepted);
  // Printed for the record: the figures the bounds above guard.
  WARN("idle threads=" << idle.threads << " rss_kib=" << idle.rss_kib << "; peak threads=" << peak.threads
                       << " rss_kib=" << peak.rss_kib << "; accepted=" << outcomes.ok()
                       << " refused=" << outcomes.refused());
  server.Shutdown();
}

TEST_CASE("the retrying reward client rides out RESOURCE_EXHAUSTED") {
  const testing::GatedVerifier slow("cat > /dev/null\nsleep 2\necho 1");
  auto scorer = slow.MakeScorer();
  REQUIRE(scorer.ok());
  RpcServer server(ServerOptions{});
  RewardServiceOptions options;
  options.score_threads = 1;
  options.score_queue = 0;
  RewardServiceImpl service(&server.auth(), scorer->get(), options);
  server.AddService(&service);
  REQUIRE(server.Start().ok());
  auto rpc = RpcClient::Create(server.address());
  REQUIRE(rpc.ok());
  auto stub = RewardService::NewStub(rpc->channel());

  // One slow call holds the only slot...
  Outcomes first;
  AsyncCall holder;
  holder.ctx = rpc->NewContext(kDeadline);
  holder.request = SlowRequest(slow, "7");
  stub->async()->Score(holder.ctx.get(), &holder.request, &holder.response,
                       [&first](grpc::Status s) { first.Add(s); });
  const absl::Time deadline = absl::Now() + kDeadline;
  while (service.score_calls_held() < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  REQUIRE(service.score_calls_held() == 1);
  // ...which a plain call sees as RESOURCE_EXHAUSTED.
  ScoreRequest quick;
  ScoreItem* item = quick.add_items();
  item->set_completion_text("1");
  item->set_reference_answer("1");
  {
    ScoreResponse resp;
    auto ctx = rpc->NewContext(kDeadline);
    REQUIRE(stub->Score(ctx.get(), quick, &resp).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }

  // The reward client backs off and retries until the slot frees.
  RetryOptions retry;
  retry.total_timeout = kDeadline;
  auto client = MakeGrpcRewardClient(*rpc, retry);
  auto scored = client->Score(quick, kDeadline);
  CHECK(scored.ok());
  if (scored.ok()) CHECK(scored->results(0).reward() == 1.0);
  REQUIRE(first.WaitForCompleted(1, kDeadline));
  INFO("refused: " << first.last_refusal() << "; failed: " << first.last_other());
  CHECK(first.ok() == 1);
  server.Shutdown();
}

}  // namespace
}  // namespace rlmesh
