#include "reward_server/circuit_breaker.h"

#include <utility>

namespace rlmesh {

CircuitBreaker::CircuitBreaker(CircuitBreakerOptions options, std::function<absl::Time()> clock)
    : clock_(std::move(clock)), options_(options) {}

bool CircuitBreaker::Allow() {
  absl::MutexLock lock(&mu_);
  switch (state_) {
    case State::kClosed:
      return true;
    case State::kOpen:
      if (clock_() < reopen_at_) return false;
      state_ = State::kHalfOpen;
      probing_ = true;
      return true;
    case State::kHalfOpen:
      // One probe at a time: the others wait for its verdict.
      if (probing_) return false;
      probing_ = true;
      return true;
  }
  return false;
}

void CircuitBreaker::RecordSuccess() {
  absl::MutexLock lock(&mu_);
  state_ = State::kClosed;
  failures_ = 0;
  probing_ = false;
}

void CircuitBreaker::RecordFailure() {
  absl::MutexLock lock(&mu_);
  ++failures_;
  probing_ = false;
  // A failed probe reopens at once; a closed circuit opens at the threshold.
  // A call let through before the circuit opened and failing after changes
  // only the count.
  const bool open = state_ == State::kHalfOpen ||
                    (state_ == State::kClosed && options_.failures_to_open > 0 && failures_ >= options_.failures_to_open);
  if (open) {
    state_ = State::kOpen;
    reopen_at_ = clock_() + options_.cooldown;
  }
}

void CircuitBreaker::SetOptions(const CircuitBreakerOptions& options) {
  absl::MutexLock lock(&mu_);
  options_ = options;
}

CircuitBreaker::State CircuitBreaker::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

int CircuitBreaker::consecutive_failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

}  // namespace rlmesh
