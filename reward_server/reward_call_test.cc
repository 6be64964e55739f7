// ScoreWithPolicy against fake endpoints: one that hangs until the call's
// deadline (a verifier that never returns), one that fails a given number
// of times, one that refuses the request.

#include "reward_server/reward_call.h"

#include <atomic>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

// How long a fake hangs at most when the caller set no deadline: far above
// every bound the tests check, so a missing deadline fails them instead of
// hanging them.
constexpr absl::Duration kHangCap = absl::Seconds(10);

class FakeEndpoint : public RewardClient {
 public:
  enum class Mode { kAnswer, kHang, kFail, kRefuse };

  absl::StatusOr<ScoreResponse> Score(const ScoreRequest& request, absl::Duration timeout) override {
    ++calls;
    Mode m = mode;
    if (m == Mode::kFail && failures_left > 0) {
      --failures_left;
      return absl::UnavailableError("fake reward server: down");
    }
    if (m == Mode::kHang) {
      // Stuck until the call's deadline (or the cap); nothing wakes it.
      const bool capped = timeout > kHangCap;
      absl::Notification never;
      never.WaitForNotificationWithTimeout(capped ? kHangCap : timeout);
      if (capped) return absl::UnavailableError("fake reward server: hung past the cap (no deadline)");
      return absl::DeadlineExceededError("fake reward server: deadline exceeded");
    }
    if (m == Mode::kRefuse) return absl::InvalidArgumentError("verifiers[0].name: unknown");
    ScoreResponse r;
    r.set_reward_source("fake");
    for (const ScoreItem& item : request.items()) {
      ScoreResult* res = r.add_results();
      res->set_item_id(item.item_id());
      res->set_reward(1);
    }
    return r;
  }

  std::atomic<Mode> mode{Mode::kAnswer};
  std::atomic<int> failures_left{0};
  std::atomic<int> calls{0};
};

ScoreRequest TwoItems() {
  ScoreRequest r;
  r.add_items()->set_item_id("e/1/p/0");
  r.add_items()->set_item_id("e/1/p/1");
  return r;
}

RewardCallPolicy Policy(const std::string& on_failure, int64_t timeout_ms, int retries = 0) {
  RewardCallPolicy p;
  p.set_on_failure(on_failure);
  p.set_timeout_ms(timeout_ms);
  p.set_retries(retries);
  p.set_breaker_failures(0);
  return p;
}

TEST_CASE("a hung reward call is cut at timeout_ms; under zero every sample scores 0") {
  FakeEndpoint hung;
  hung.mode = FakeEndpoint::Mode::kHang;
  const absl::Time start = absl::Now();
  auto out = ScoreWithPolicy(hung, nullptr, Policy("zero", 100), TwoItems(), absl::InfiniteDuration());
  const absl::Duration took = absl::Now() - start;
  REQUIRE(out.ok());
  CHECK(took < absl::Seconds(3));  // the deadline cut it, not the fake's cap
  CHECK(out->kind == ScoreOutcome::Kind::kZeroed);
  CHECK(out->failure.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(out->calls == 1);
  REQUIRE(out->response.results_size() == 2);
  for (const auto& r : out->response.results()) CHECK(r.reward() == 0);
  CHECK(out->response.results(1).item_id() == "e/1/p/1");
  CHECK(out->response.reward_source() == kFailedRewardSource);
}

TEST_CASE("a hung reward call under drop_group drops the group") {
  FakeEndpoint hung;
  hung.mode = FakeEndpoint::Mode::kHang;
  const absl::Time start = absl::Now();
  auto out = ScoreWithPolicy(hung, nullptr, Policy("drop_group", 100), TwoItems(), absl::InfiniteDuration());
  CHECK(absl::Now() - start < absl::Seconds(3));
  REQUIRE(out.ok());
  CHECK(out->kind == ScoreOutcome::Kind::kDropped);
  CHECK(out->response.results_size() == 0);
}

TEST_CASE("retry: a failing call is repeated `retries` times, then the last failure is returned") {
  FakeEndpoint hung;
  hung.mode = FakeEndpoint::Mode::kHang;
  const absl::Time start = absl::Now();
  auto out = ScoreWithPolicy(hung, nullptr, Policy("retry", 50, 2), TwoItems(), absl::InfiniteDuration());
  CHECK(absl::Now() - start < absl::Seconds(3));
  CHECK(out.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(hung.calls == 3);

  FakeEndpoint flaky;
  flaky.mode = FakeEndpoint::Mode::kFail;
  flaky.failures_left = 2;
  auto ok = ScoreWithPolicy(flaky, nullptr, Policy("retry", 50, 2), TwoItems(), absl::InfiniteDuration());
  REQUIRE(ok.ok());
  CHECK(ok->kind == ScoreOutcome::Kind::kScored);
  CHECK(ok->calls == 3);
  CHECK(ok->response.results(0).reward() == 1);
}

TEST_CASE("a refusal is the request's fault: returned as it is, never zeroed or dropped") {
  FakeEndpoint refusing;
  refusing.mode = FakeEndpoint::Mode::kRefuse;
  auto out = ScoreWithPolicy(refusing, nullptr, Policy("zero", 100, 3), TwoItems(), absl::InfiniteDuration());
  CHECK(out.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(refusing.calls == 1);
}

TEST_CASE("the breaker stops calls to an endpoint that keeps failing, probes after the cooldown, closes") {
  absl::Time now = absl::FromUnixSeconds(1000);
  CircuitBreaker breaker({.failures_to_open = 3, .cooldown = absl::Seconds(5)}, [&now] { return now; });
  FakeEndpoint down;
  down.mode = FakeEndpoint::Mode::kFail;
  down.failures_left = 1000;
  const RewardCallPolicy zero = Policy("zero", 100);
  for (int i = 0; i < 3; ++i) {
    auto out = ScoreWithPolicy(down, &breaker, zero, TwoItems(), absl::InfiniteDuration());
    REQUIRE(out.ok());
    CHECK(out->kind == ScoreOutcome::Kind::kZeroed);
  }
  CHECK(down.calls == 3);
  CHECK(breaker.state() == CircuitBreaker::State::kOpen);
  // Open: scored by the policy at once, the endpoint never called.
  auto refused = ScoreWithPolicy(down, &breaker, zero, TwoItems(), absl::InfiniteDuration());
  REQUIRE(refused.ok());
  CHECK(refused->kind == ScoreOutcome::Kind::kZeroed);
  CHECK(refused->calls == 0);
  CHECK(absl::StrContains(refused->failure.message(), "circuit open"));
  CHECK(down.calls == 3);
  // Under retry an open circuit is not retried against.
  auto retried = ScoreWithPolicy(down, &breaker, Policy("retry", 100, 5), TwoItems(), absl::InfiniteDuration());
  CHECK(retried.status().code() == absl::StatusCode::kUnavailable);
  CHECK(down.calls == 3);

  // After the cooldown one probe goes out; it fails, the circuit reopens.
  now += absl::Seconds(5);
  auto probe = ScoreWithPolicy(down, &breaker, zero, TwoItems(), absl::InfiniteDuration());
  CHECK(probe->calls == 1);
  CHECK(breaker.state() == CircuitBreaker::State::kOpen);
  CHECK(ScoreWithPolicy(down, &breaker, zero, TwoItems(), absl::InfiniteDuration())->calls == 0);
  // The endpoint recovers: the next probe succeeds and closes the circuit.
  down.mode = FakeEndpoint::Mode::kAnswer;
  now += absl::Seconds(5);
  auto healed = ScoreWithPolicy(down, &breaker, zero, TwoItems(), absl::InfiniteDuration());
  REQUIRE(healed.ok());
  CHECK(healed->kind == ScoreOutcome::Kind::kScored);
  CHECK(breaker.state() == CircuitBreaker::State::kClosed);
}

}  // namespace
}  // namespace rlmesh
