#pragma once

// One group's Score call from a rollout worker under the experiment's
// reward.call policy (RewardCallPolicy, carried by GenerateRequest): a
// deadline per call, what a failure turns into (retry, reward 0, or the
// group dropped) and the endpoint's circuit breaker. Knows no gRPC: the
// RewardClient interface is the endpoint.

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/config.pb.h"
#include "proto/reward.pb.h"
#include "reward_server/circuit_breaker.h"
#include "reward_server/client.h"

namespace rlmesh {

struct ScoreOutcome {
  enum class Kind {
    kScored,   // the server's answer is in `response`
    kZeroed,   // on_failure "zero": `response` gives every item reward 0
    kDropped,  // on_failure "drop_group": store nothing, go on without it
  };
  Kind kind = Kind::kScored;
  ScoreResponse response;
  // kZeroed / kDropped: the failure that decided it.
  absl::Status failure;
  // Calls that went out (the open circuit refuses without calling).
  int calls = 0;
};

// reward_source of a zeroed group's trajectories.
inline constexpr char kFailedRewardSource[] = "failed";

// Whether `s` says the endpoint failed (it died, hung, was overloaded or
// broke) rather than refused the request: UNAVAILABLE, DEADLINE_EXCEEDED,
// RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNKNOWN, DATA_LOSS, CANCELLED.
// Only these are retried, zeroed or dropped, and only these count against
// the breaker; a refusal (INVALID_ARGUMENT, ...) is returned as it is.
bool EndpointFailed(const absl::Status& s);

// The breaker options `policy` names.
CircuitBreakerOptions BreakerOptions(const RewardCallPolicy& policy);

// Scores `request` with `client` under `policy`. Each call's deadline is
// policy.timeout_ms (0: `default_timeout`). `breaker` (may be null) is
// asked before every call and told every outcome; while it is open no call
// goes out and the attempt fails UNAVAILABLE at once. Under on_failure
// "retry" a failed call is repeated up to policy.retries times (never while
// the circuit is open) and the last failure is returned; "zero" and
// "drop_group" turn the failure into an outcome instead. Safe for
// concurrent use when `client` and `breaker` are.
absl::StatusOr<ScoreOutcome> ScoreWithPolicy(RewardClient& client, CircuitBreaker* breaker,
                                             const RewardCallPolicy& policy, const ScoreRequest& request,
                                             absl::Duration default_timeout);

}  // namespace rlmesh
