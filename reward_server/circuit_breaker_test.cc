#include "reward_server/circuit_breaker.h"

#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

using State = CircuitBreaker::State;

// A clock the test moves by hand.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::function<absl::Time()> fn() {
    return [this] { return now; };
  }
};

TEST_CASE("opens after N consecutive failures and refuses for the cooldown") {
  FakeClock clock;
  CircuitBreaker b({.failures_to_open = 3, .cooldown = absl::Seconds(10)}, clock.fn());
  for (int i = 0; i < 2; ++i) {
    REQUIRE(b.Allow());
    b.RecordFailure();
  }
  CHECK(b.state() == State::kClosed);
  // A success in between resets the count: failures must be consecutive.
  REQUIRE(b.Allow());
  b.RecordSuccess();
  CHECK(b.consecutive_failures() == 0);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(b.Allow());
    b.RecordFailure();
  }
  CHECK(b.state() == State::kOpen);
  CHECK_FALSE(b.Allow());
  clock.now += absl::Seconds(9);
  CHECK_FALSE(b.Allow());
}

TEST_CASE("after the cooldown one probe goes out: success closes, failure reopens for another cooldown") {
  FakeClock clock;
  CircuitBreaker b({.failures_to_open = 1, .cooldown = absl::Seconds(10)}, clock.fn());
  REQUIRE(b.Allow());
  b.RecordFailure();
  REQUIRE(b.state() == State::kOpen);

  clock.now += absl::Seconds(10);
  CHECK(b.Allow());  // the probe
  CHECK(b.state() == State::kHalfOpen);
  CHECK_FALSE(b.Allow());  // only one at a time
  b.RecordFailure();
  CHECK(b.state() == State::kOpen);
  CHECK_FALSE(b.Allow());
  clock.now += absl::Seconds(9);
  CHECK_FALSE(b.Allow());  // the new cooldown counts from the failed probe
  clock.now += absl::Seconds(1);
  CHECK(b.Allow());
  b.RecordSuccess();
  CHECK(b.state() == State::kClosed);
  CHECK(b.consecutive_failures() == 0);
  CHECK(b.Allow());
  CHECK(b.Allow());
}

TEST_CASE("failures_to_open 0 never opens") {
  FakeClock clock;
  CircuitBreaker b({.failures_to_open = 0, .cooldown = absl::Seconds(1)}, clock.fn());
  for (int i = 0; i < 100; ++i) {
    REQUIRE(b.Allow());
    b.RecordFailure();
  }
  CHECK(b.state() == State::kClosed);
  CHECK(b.consecutive_failures() == 100);
}

}  // namespace
}  // namespace rlmesh
