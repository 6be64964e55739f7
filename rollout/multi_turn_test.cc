// Multi-turn rollouts against a fake environment: the exact token layout
// (model turns, spliced observations, loss mask, turn records), token-in /
// token-out (each turn equals a fresh generation from prompt + everything
// before it), stop markers, max_turns and the token budget, environment
// errors, validation, and that other sequences keep decoding while an
// episode waits on its environment.
#include <cmath>
#include <functional>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "actor/tokenizer.h"
#include "common/testing/test_util.h"
#include "environment/client.h"
#include "rollout/rollout_worker.h"
#include "rollout/testing/tiny_model.h"
// Last: LibTorch (through tiny_model.h) defines a CHECK of its own.
#include "catch2/catch.hpp"

namespace rlmesh::rollout {
namespace {

using testing::MakeRequest;
using testing::ReferenceGenerate;
using testing::WriteTinyCheckpoint;

// Every Step answers `observation` with `reward`; done after `done_after`
// steps. Records the calls. Safe for concurrent use.
class FakeEnvironment final : public EnvironmentClient {
 public:
  std::string first_observation;
  std::string observation = "<ok>";
  double reward = 0.25;
  int done_after = 1000;
  absl::Status step_error;
  // Run inside Step before answering (e.g. block).
  std::function<void(const StepRequest&)> on_step;

  absl::StatusOr<ResetResponse> Reset(const ResetRequest& request, absl::Duration timeout) override {
    absl::MutexLock lock(&mu);
    resets.push_back(request);
    timeouts.push_back(timeout);
    ResetResponse r;
    r.set_episode_id("ep" + std::to_string(resets.size()));
    r.set_observation(first_observation);
    steps_of[r.episode_id()] = 0;
    return r;
  }
  absl::StatusOr<StepResponse> Step(const StepRequest& request, absl::Duration timeout) override {
    if (on_step) on_step(request);
    absl::MutexLock lock(&mu);
    steps.push_back(request);
    timeouts.push_back(timeout);
    if (!step_error.ok()) return step_error;
    StepResponse r;
    r.set_observation(observation);
    r.set_reward(reward);
    r.set_done(++steps_of[request.episode_id()] >= done_after);
    (*r.mutable_info())["step"] = std::to_string(steps_of[request.episode_id()]);
    return r;
  }
  absl::Status Close(const CloseRequest& request, absl::Duration) override {
    absl::MutexLock lock(&mu);
    closed.push_back(request.episode_id());
    return absl::OkStatus();
  }

  absl::Mutex mu;
  std::vector<ResetRequest> resets;
  std::vector<StepRequest> steps;
  std::vector<std::string> closed;
  std::vector<absl::Duration> timeouts;
  std::map<std::string, int> steps_of;
};

struct Collector {
  absl::Mutex mu;
  std::vector<TrajectoryGroup> groups;
  std::optional<absl::Status> done;
  RolloutWorker::GroupSink Sink() {
    return [this](TrajectoryGroup g, bool) {
      absl::MutexLock lock(&mu);
      groups.push_back(std::move(g));
    };
  }
  RolloutWorker::DoneCallback Done() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu);
      done = s;
    };
  }
  absl::Status Wait(absl::Duration timeout = absl::Seconds(60)) {
    absl::MutexLock lock(&mu);
    auto has = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done.has_value(); };
    if (!mu.AwaitWithTimeout(absl::Condition(&has), timeout)) return absl::DeadlineExceededError("no done callback");
    return *done;
  }
};

GenerateRequest MultiTurn(const std::vector<std::string>& prompts, int n, int per_turn, int max_turns) {
  GenerateRequest r = MakeRequest(prompts, n, per_turn, 5);
  r.mutable_sampling()->set_greedy(true);
  r.mutable_environment()->set_address("fake:1");
  r.mutable_environment()->set_max_turns(max_turns);
  r.mutable_environment()->add_stop_markers("</calc>");
  r.mutable_environment()->set_timeout_ms(1234);
  return r;
}

std::vector<int64_t> Encode(const std::string& s) {
  actor::CharTokenizer tok;
  auto ids = tok.Encode(s);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

// Greedy tokens and log-probs from `prefix` (token ids), as actor/ makes them.
actor::Completion Reference(const std::string& dir, const std::vector<int64_t>& prefix, int max_new_tokens) {
  GenerateRequest r;
  r.set_n(1);
  r.mutable_sampling()->set_greedy(true);
  r.mutable_sampling()->set_max_new_tokens(max_new_tokens);
  Prompt* p = r.add_prompts();
  for (int64_t id : prefix) p->add_token_ids(static_cast<int>(id));
  auto ref = ReferenceGenerate(dir, r);
  REQUIRE(ref.ok());
  return (*ref)[0].samples[0];
}

struct Fixture {
  ::rlmesh::testing::TempDir dir;
  FakeEnvironment env;
  std::unique_ptr<RolloutWorker> worker;
  explicit Fixture(RolloutWorkerOptions o = {}) {
    REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 3).ok());
    worker = std::make_unique<RolloutWorker>(o, std::make_unique<actor::CharTokenizer>(), nullptr, nullptr, &env);
    REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 0).ok());
  }
};

TEST_CASE("multi-turn: turns, spliced observations, mask and log-probs are exact") {
  Fixture f;
  f.env.first_observation = "[";
  GenerateRequest req = MultiTurn({"12*34="}, 2, 3, 3);
  Collector col;
  REQUIRE(f.worker->Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  REQUIRE(col.groups.size() == 1);
  const TrajectoryGroup& g = col.groups[0];
  REQUIRE(g.samples_size() == 2);
  const std::vector<int64_t> prompt = Encode("12*34=");
  const std::vector<int64_t> first = Encode("[");
  const std::vector<int64_t> obs = Encode("<ok>");
  for (const Trajectory& t : g.samples()) {
    INFO("sample " << t.sample_index());
    // [ (env) | 3 model | <ok> (env) | 3 model | <ok> (env) | 3 model:
    // the third turn hits max_turns, its observation is not appended.
    REQUIRE(t.response_token_ids_size() == 1 + 3 + 4 + 3 + 4 + 3);
    REQUIRE(t.loss_mask_size() == t.response_token_ids_size());
    REQUIRE(t.behaviour_logprobs_size() == t.response_token_ids_size());
    const std::vector<int> want_mask = {0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1};
    for (int k = 0; k < t.loss_mask_size(); ++k) CHECK(t.loss_mask(k) == want_mask[k]);
    REQUIRE(t.turns_size() == 6);
    const int starts[] = {0, 1, 4, 8, 11, 15};
    const int ends[] = {1, 4, 8, 11, 15, 18};
    for (int k = 0; k < 6; ++k) {
      CHECK(t.turns(k).token_start() == starts[k]);
      CHECK(t.turns(k).token_end() == ends[k]);
      CHECK(t.turns(k).source() == (k % 2 == 0 ? Turn::SOURCE_ENVIRONMENT : Turn::SOURCE_MODEL));
    }
    CHECK(t.turns(1).reward() == 0.25);
    CHECK(t.turns(5).info().at("step") == "3");
    // Observations are spliced in token for token.
    CHECK(t.response_token_ids(0) == first[0]);
    for (int k = 0; k < 4; ++k) {
      CHECK(t.response_token_ids(4 + k) == obs[k]);
      CHECK(t.response_token_ids(11 + k) == obs[k]);
      CHECK(t.behaviour_logprobs(4 + k) == 0.0f);
    }
    // Token-in, token-out: each model turn is what the policy generates
    // from the prompt and every token before it, never re-tokenised.
    std::vector<int64_t> prefix = prompt;
    for (int turn : {1, 3, 5}) {
      const int s = t.turns(turn).token_start();
      std::vector<int64_t> before = prompt;
      for (int k = 0; k < s; ++k) before.push_back(t.response_token_ids(k));
      actor::Completion ref = Reference(f.dir.File("v1"), before, 3);
      REQUIRE(ref.tokens.size() == 3);
      for (int k = 0; k < 3; ++k) {
        CHECK(t.response_token_ids(s + k) == ref.tokens[k]);
        CHECK(std::abs(t.behaviour_logprobs(s + k) - ref.logprobs[k]) < 1e-4);
      }
    }
    CHECK(t.environment_reward() == 0.75);
    CHECK(t.reward() == 0.75);
    CHECK(t.reward_components().at("environment") == 0.75);
    CHECK_FALSE(t.episode_id().empty());
    CHECK(t.finish_reason() == FINISH_REASON_LENGTH);
  }
  absl::MutexLock lock(&f.env.mu);
  CHECK(f.env.resets.size() == 2);
  CHECK(f.env.steps.size() == 6);
  CHECK(f.env.closed.size() == 2);
  CHECK(f.env.resets[0].task().prompt_text() == "12*34=");
  CHECK(f.env.resets[0].task().reference_answer() == "0");
  // The environment saw each turn's tokens as the model sampled them.
  for (const StepRequest& s : f.env.steps) {
    CHECK(s.action_token_ids_size() == 3);
    CHECK(s.turn() >= 0);
    CHECK(s.turn() < 3);
  }
  for (absl::Duration d : f.env.timeouts) CHECK(d == absl::Milliseconds(1234));
}

TEST_CASE("multi-turn: the environment's done ends the episode; the token budget caps it") {
  Fixture f;
  f.env.done_after = 1;
  GenerateRequest req = MultiTurn({"abc"}, 1, 4, 5);
  Collector col;
  REQUIRE(f.worker->Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  const Trajectory& t = col.groups.at(0).samples(0);
  CHECK(t.response_token_ids_size() == 4);
  CHECK(t.turns_size() == 1);
  CHECK(t.environment_reward() == 0.25);

  // Budget 10: turn (4) + obs (4) = 8 leaves 2: the second turn gets 2
  // tokens, then no room for an observation and a turn.
  f.env.done_after = 1000;
  GenerateRequest capped = MultiTurn({"abc"}, 1, 4, 5);
  capped.mutable_environment()->set_max_total_tokens(10);
  Collector col2;
  REQUIRE(f.worker->Submit(capped, col2.Sink(), col2.Done()).ok());
  REQUIRE(col2.Wait().ok());
  const Trajectory& c = col2.groups.at(0).samples(0);
  CHECK(c.response_token_ids_size() == 10);
  REQUIRE(c.turns_size() == 3);
  CHECK(c.turns(2).token_end() - c.turns(2).token_start() == 2);
  CHECK(c.finish_reason() == FINISH_REASON_LENGTH);
}

TEST_CASE("multi-turn: a stop marker ends the model's turn") {
  Fixture f;
  // The greedy continuation of the prompt, and a marker made of its 2nd and
  // 3rd tokens: the first turn must stop right after them.
  const std::vector<int64_t> prompt = Encode("hello");
  actor::Completion ref = Reference(f.dir.File("v1"), prompt, 8);
  actor::CharTokenizer tok;
  const std::string marker = tok.Decode({static_cast<int>(ref.tokens[1]), static_cast<int>(ref.tokens[2])});
  REQUIRE(Encode(marker) == std::vector<int64_t>(ref.tokens.begin() + 1, ref.tokens.begin() + 3));
  // Where the marker first ends in the greedy tokens (3, unless a repeat
  // makes it appear sooner).
  size_t stop_at = 2;
  while (!(ref.tokens[stop_at - 1] == ref.tokens[2] && ref.tokens[stop_at - 2] == ref.tokens[1])) ++stop_at;
  GenerateRequest req = MultiTurn({"hello"}, 1, 8, 1);
  req.mutable_environment()->set_stop_markers(0, marker);
  Collector col;
  REQUIRE(f.worker->Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  const Trajectory& t = col.groups.at(0).samples(0);
  CHECK(t.response_token_ids_size() == static_cast<int>(stop_at));
  CHECK(t.finish_reason() == FINISH_REASON_STOP);
  absl::MutexLock lock(&f.env.mu);
  REQUIRE(f.env.steps.size() == 1);
  CHECK(f.env.steps[0].action_token_ids_size() == static_cast<int>(stop_at));
}

TEST_CASE("multi-turn: other sequences keep decoding while an episode waits on its environment") {
  Fixture f;
  absl::Notification release, stepping;
  f.env.done_after = 1;
  f.env.on_step = [&](const StepRequest&) {
    if (!stepping.HasBeenNotified()) stepping.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
  };
  Collector slow;
  REQUIRE(f.worker->Submit(MultiTurn({"slow"}, 1, 3, 2), slow.Sink(), slow.Done()).ok());
  REQUIRE(stepping.WaitForNotificationWithTimeout(absl::Seconds(60)));
  // The episode is blocked in Step: a single-turn request still completes.
  Collector fast;
  REQUIRE(f.worker->Submit(MakeRequest({"fast"}, 2, 6, 1), fast.Sink(), fast.Done()).ok());
  REQUIRE(fast.Wait(absl::Seconds(60)).ok());
  CHECK(fast.groups.size() == 1);
  {
    absl::MutexLock lock(&slow.mu);
    CHECK_FALSE(slow.done.has_value());
  }
  release.Notify();
  REQUIRE(slow.Wait().ok());
  CHECK(slow.groups.size() == 1);
}

TEST_CASE("multi-turn: an environment error ends the request with it") {
  Fixture f;
  f.env.step_error = absl::UnavailableError("environment server gone");
  Collector col;
  REQUIRE(f.worker->Submit(MultiTurn({"x"}, 2, 2, 3), col.Sink(), col.Done()).ok());
  absl::Status s = col.Wait();
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(s.message() == "environment server gone");
  CHECK(col.groups.empty());
  CHECK(f.worker->WaitIdle(absl::Seconds(30)));
  // The worker goes on serving.
  f.env.step_error = absl::OkStatus();
  Collector ok;
  REQUIRE(f.worker->Submit(MultiTurn({"x"}, 1, 2, 2), ok.Sink(), ok.Done()).ok());
  CHECK(ok.Wait().ok());
}

TEST_CASE("multi-turn: bad environment settings are refused by name") {
  Fixture f;
  auto submit = [&](const GenerateRequest& r) {
    return f.worker->Submit(r, [](TrajectoryGroup, bool) {}, [](absl::Status) {}).status();
  };
  GenerateRequest no_marker = MultiTurn({"x"}, 1, 2, 2);
  no_marker.mutable_environment()->clear_stop_markers();
  CHECK(submit(no_marker).message().find("environment.stop_markers") != std::string::npos);
  GenerateRequest turns = MultiTurn({"x"}, 1, 2, 2);
  turns.mutable_environment()->set_max_turns(65);
  CHECK(submit(turns).message().find("environment.max_turns") != std::string::npos);
  GenerateRequest orphan = MakeRequest({"x"}, 1, 2, 1);
  orphan.mutable_environment()->set_max_turns(2);
  CHECK(submit(orphan).message() == "environment.max_turns: set without environment.address");

  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 3).ok());
  RolloutWorkerOptions o;
  o.on_update = RolloutWorkerOptions::OnUpdate::kAbort;
  RolloutWorker aborting(o, std::make_unique<actor::CharTokenizer>(), nullptr, nullptr, &f.env);
  REQUIRE(aborting.LoadCheckpoint(dir.File("v1"), 0).ok());
  auto s = aborting.Submit(MultiTurn({"x"}, 1, 2, 2), [](TrajectoryGroup, bool) {}, [](absl::Status) {});
  CHECK(s.status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("multi-turn: a weight update under kFinish waits for running episodes") {
  Fixture f;
  absl::Notification release, stepping;
  f.env.done_after = 2;
  f.env.on_step = [&](const StepRequest&) {
    if (!stepping.HasBeenNotified()) stepping.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
  };
  Collector col;
  REQUIRE(f.worker->Submit(MultiTurn({"abc"}, 1, 2, 3), col.Sink(), col.Done()).ok());
  REQUIRE(stepping.WaitForNotificationWithTimeout(absl::Seconds(60)));
  REQUIRE(WriteTinyCheckpoint(f.dir.File("v2"), 4).ok());
  std::optional<absl::StatusOr<LoadResult>> load;
  std::thread loader([&] { load = f.worker->LoadCheckpoint(f.dir.File("v2"), 0); });
  // The load waits at the fence while the episode is between turns.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (f.worker->Status().pending_update_version() != 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  REQUIRE(f.worker->Status().pending_update_version() == 2);
  CHECK(f.worker->policy_version() == 1);
  release.Notify();
  loader.join();
  REQUIRE(load.has_value());
  REQUIRE(load->ok());
  REQUIRE(col.Wait().ok());
  const Trajectory& t = col.groups.at(0).samples(0);
  CHECK(t.policy_version() == 1);
  CHECK(t.version_switches_size() == 0);  // both turns on version 1
  CHECK(f.worker->policy_version() == 2);
}

}  // namespace
}  // namespace rlmesh::rollout
