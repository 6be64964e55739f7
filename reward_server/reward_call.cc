#include "reward_server/reward_call.h"

#include "absl/strings/str_cat.h"

namespace rlmesh {

bool EndpointFailed(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

CircuitBreakerOptions BreakerOptions(const RewardCallPolicy& policy) {
  CircuitBreakerOptions o;
  o.failures_to_open = policy.has_breaker_failures() ? policy.breaker_failures() : 5;
  o.cooldown = absl::Milliseconds(policy.breaker_cooldown_ms() > 0 ? policy.breaker_cooldown_ms() : 10000);
  return o;
}

absl::StatusOr<ScoreOutcome> ScoreWithPolicy(RewardClient& client, CircuitBreaker* breaker,
                                             const RewardCallPolicy& policy, const ScoreRequest& request,
                                             absl::Duration default_timeout) {
  const absl::Duration timeout = policy.timeout_ms() > 0 ? absl::Milliseconds(policy.timeout_ms()) : default_timeout;
  const std::string& on_failure = policy.on_failure();
  const bool retry = on_failure.empty() || on_failure == "retry";
  if (!retry && on_failure != "zero" && on_failure != "drop_group") {
    return absl::InvalidArgumentError(
        absl::StrCat("reward_call.on_failure: must be retry, zero or drop_group, not \"", on_failure, "\""));
  }
  const int attempts = retry ? 1 + (policy.has_retries() ? policy.retries() : 2) : 1;
  ScoreOutcome out;
  absl::Status last;
  for (int a = 0; a < attempts; ++a) {
    if (breaker != nullptr && !breaker->Allow()) {
      // Retrying against an open circuit would only spin: give up now.
      last = absl::UnavailableError("reward server: circuit open after repeated failures (reward.call.breaker_*)");
      break;
    }
    ++out.calls;
    absl::StatusOr<ScoreResponse> r = client.Score(request, timeout);
    if (r.ok() || !EndpointFailed(r.status())) {
      // An answer, even a refusal, shows the endpoint alive.
      if (breaker != nullptr) breaker->RecordSuccess();
      if (!r.ok()) return r.status();
      out.response = *std::move(r);
      return out;
    }
    if (breaker != nullptr) breaker->RecordFailure();
    last = r.status();
  }
  if (retry) return last;
  out.failure = last;
  out.response.Clear();
  if (on_failure == "zero") {
    out.kind = ScoreOutcome::Kind::kZeroed;
    out.response.set_reward_source(kFailedRewardSource);
    for (const ScoreItem& item : request.items()) {
      ScoreResult* res = out.response.add_results();
      res->set_item_id(item.item_id());
      res->set_reward(0);
    }
  } else {
    out.kind = ScoreOutcome::Kind::kDropped;
  }
  return out;
}

}  // namespace rlmesh
