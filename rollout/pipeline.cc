// Rollout worker: handing finished groups to the request's callbacks, and
// the pipeline that scores a group (reward server) and stores it (replay
// buffer) on a pipeline thread before it is handed back.

#include "rollout/worker_impl.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "reward_server/reward_call.h"

namespace rlmesh::rollout {

void RolloutWorker::Impl::Deliver(const std::shared_ptr<RequestHandle>& req, TrajectoryGroup group, bool stored,
                                  absl::Status status) {
  bool cancelled;
  {
    absl::MutexLock lock(&mu);
    cancelled = req->cancelled;
  }
  {
    absl::MutexLock lock(&req->deliver_mu);
    if (!cancelled && !req->closed && req->on_group) req->on_group(std::move(group), stored);
  }
  FinishOne(req, std::move(status));
}

// Counts one group of `req` as delivered; ends the request after the last.
void RolloutWorker::Impl::FinishOne(const std::shared_ptr<RequestHandle>& req, absl::Status status) {
  absl::Status final_status;
  {
    absl::MutexLock lock(&mu);
    if (!status.ok() && req->status.ok()) req->status = status;
    if (--req->groups_left > 0 || req->done) return;
    req->done = true;
    final_status = req->cancelled ? absl::CancelledError("request cancelled") : req->status;
  }
  // One span per Generate call: from Submit to its last group delivered.
  RecordSpan(req->request.pipeline() ? "generate" : "generate_eval", "rollout", req->submitted_us,
             NowMicros() - req->submitted_us,
             absl::StrCat("{\"prompts\":", req->request.prompts_size(), ",\"n\":", req->request.n(),
                          ",\"version\":", req->version, "}"));
  absl::MutexLock lock(&req->deliver_mu);
  req->closed = true;
  if (req->on_done) req->on_done(final_status);
}

// Ends a request that never reached the generator.
void RolloutWorker::Impl::EndUndelivered(const std::shared_ptr<RequestHandle>& req, absl::Status status) {
  {
    absl::MutexLock lock(&mu);
    if (req->done) return;
    req->done = true;
  }
  absl::MutexLock lock(&req->deliver_mu);
  req->closed = true;
  if (req->on_done) req->on_done(status);
}

void RolloutWorker::Impl::RunPipeline(std::shared_ptr<RequestHandle> req, TrajectoryGroup group) {
  bool dropped = false;
  absl::Status s = ScoreAndStore(req->request, &group, &dropped);
  if (dropped) {
    RLMESH_LOG(WARNING) << "pipeline dropped group=" << group.group_id() << " (reward_call.on_failure drop_group)";
    absl::MutexLock lock(&mu);
    ++dropped_groups;
  } else if (!s.ok()) {
    RLMESH_LOG(WARNING) << "pipeline failed group=" << group.group_id() << ": " << s.message();
    absl::MutexLock lock(&mu);
    ++failed_groups;
  }
  Deliver(req, std::move(group), s.ok() && !dropped, s);
  absl::MutexLock lock(&mu);
  --pipeline_busy;
}

absl::Status RolloutWorker::Impl::ScoreAndStore(const GenerateRequest& r, TrajectoryGroup* group, bool* dropped) {
  ScoreRequest sr;
  sr.set_experiment_id(r.experiment_id());
  *sr.mutable_verifiers() = r.verifiers();
  sr.set_verifier_timeout_ms(r.verifier_timeout_ms());
  for (const Trajectory& t : group->samples()) {
    ScoreItem* item = sr.add_items();
    item->set_item_id(t.trajectory_id());
    *item->mutable_prompt_token_ids() = t.prompt_token_ids();
    *item->mutable_completion_token_ids() = t.response_token_ids();
    item->set_reference_answer(t.reference_answer());
    *item->mutable_metadata() = t.metadata();
    item->set_max_new_tokens(r.sampling().max_new_tokens());
  }
  // A request without a reward_call keeps the old behaviour: one call
  // under the client's own deadline and retries, no breaker.
  RewardCallPolicy policy = r.reward_call();
  if (!r.has_reward_call()) {
    policy.set_retries(0);
    policy.set_breaker_failures(0);
  }
  CircuitBreaker* breaker = nullptr;
  if (BreakerOptions(policy).failures_to_open > 0) {  // unset = the default 5
    reward_breaker.SetOptions(BreakerOptions(policy));
    breaker = &reward_breaker;
  }
  absl::StatusOr<ScoreOutcome> outcome = [&] {
    TraceSpan span("score", "rollout");
    return ScoreWithPolicy(*reward, breaker, policy, sr, absl::InfiniteDuration());
  }();
  if (!outcome.ok()) {
    return absl::Status(outcome.status().code(), absl::StrCat("reward server: ", outcome.status().message()));
  }
  if (outcome->kind == ScoreOutcome::Kind::kDropped) {
    *dropped = true;
    return absl::OkStatus();
  }
  if (outcome->kind == ScoreOutcome::Kind::kZeroed) {
    RLMESH_LOG(WARNING) << "pipeline zeroed group=" << group->group_id()
                        << " (reward_call.on_failure zero): " << outcome->failure.message();
  }
  const ScoreResponse* scored = &outcome->response;
  if (scored->results_size() != group->samples_size()) {
    return absl::InternalError(absl::StrCat("reward server: ", scored->results_size(), " results for ",
                                            group->samples_size(), " items"));
  }
  const int64_t now = NowMicros();
  for (int i = 0; i < group->samples_size(); ++i) {
    Trajectory* t = group->mutable_samples(i);
    const ScoreResult& res = scored->results(i);
    t->set_reward(res.reward());
    *t->mutable_reward_components() = res.components();
    if (!r.environment().address().empty()) {
      // Multi-turn: the verifiers' reward plus the weighted sum of the
      // environment's step rewards (component "environment").
      const double weight = r.environment().has_reward_weight() ? r.environment().reward_weight() : 1.0;
      t->set_reward(res.reward() + weight * t->environment_reward());
      (*t->mutable_reward_components())["environment"] = t->environment_reward();
    }
    t->mutable_provenance()->set_reward_source(scored->reward_source());
    t->set_scored_unix_micros(now);
  }
  PutGroupsRequest put;
  *put.add_groups() = *group;
  absl::StatusOr<PutGroupsResponse> stored = [&] {
    TraceSpan span("put_groups", "rollout");
    return replay->PutGroups(put);
  }();
  if (!stored.ok()) {
    return absl::Status(stored.status().code(), absl::StrCat("replay buffer: ", stored.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::rollout
