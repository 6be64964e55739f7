#pragma once

// A circuit breaker for calls to one endpoint (a rollout worker's reward
// server): after `failures_to_open` consecutive failures the circuit opens
// and calls are refused at once for `cooldown`; then one probe call is let
// through (half-open): its success closes the circuit, its failure opens it
// for another cooldown. Time comes from an injected clock.
//
// Safe for concurrent use (the worker's pipeline threads share one).

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rlmesh {

struct CircuitBreakerOptions {
  // Consecutive failures that open the circuit; 0 = it never opens.
  // Default 5.
  int failures_to_open = 5;
  // How long an open circuit refuses calls before one probe. Default 10 s.
  absl::Duration cooldown = absl::Seconds(10);

  bool operator==(const CircuitBreakerOptions& o) const {
    return failures_to_open == o.failures_to_open && cooldown == o.cooldown;
  }
};

class CircuitBreaker {
 public:
  enum class State { kClosed, kOpen, kHalfOpen };

  explicit CircuitBreaker(CircuitBreakerOptions options, std::function<absl::Time()> clock = [] { return absl::Now(); });

  // Whether a call may go out now. Closed: yes. Open: no until the cooldown
  // has passed, then yes for exactly one caller (the probe; the circuit is
  // half-open) and no for the others until that probe reports. Every call
  // that Allow() let through must be followed by RecordSuccess or
  // RecordFailure.
  bool Allow();
  void RecordSuccess();
  void RecordFailure();

  // Takes new options, keeping the state and the failure count.
  void SetOptions(const CircuitBreakerOptions& options);

  State state() const;
  int consecutive_failures() const;

 private:
  // Constant after construction.
  const std::function<absl::Time()> clock_;

  mutable absl::Mutex mu_;
  CircuitBreakerOptions options_ ABSL_GUARDED_BY(mu_);
  State state_ ABSL_GUARDED_BY(mu_) = State::kClosed;
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
  // When the open circuit lets its probe through.
  absl::Time reopen_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Half-open: the probe is out.
  bool probing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rlmesh
