#include "rollout/rollout_worker.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "actor/checkpoint.h"
#include "actor/lora.h"
#include "actor/tokenizer.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "parallel/tensor_parallel.h"
#include "rollout/testing/tiny_model.h"
#include "weight_sync/pieces.h"
#include "weight_sync/weight_sync.h"

namespace rlmesh::rollout {
namespace {

using weight_sync::CreateWeightPublisher;
using weight_sync::NamedTensors;
using weight_sync::WeightSyncStore;

using testing::MakeRequest;
using testing::ReferenceGenerate;
using testing::WriteTinyCheckpoint;

// Collects what a request hands back; every wait has a deadline.
struct Collector {
  absl::Mutex mu;
  std::vector<std::pair<TrajectoryGroup, bool>> groups;
  std::optional<absl::Status> done;
  absl::Time done_at;
  // Optional hook run inside the GroupSink (on the engine thread).
  std::function<void(const TrajectoryGroup&)> hook;

  RolloutWorker::GroupSink Sink() {
    return [this](TrajectoryGroup g, bool stored) {
      if (hook) hook(g);
      absl::MutexLock lock(&mu);
      groups.emplace_back(std::move(g), stored);
    };
  }
  RolloutWorker::DoneCallback Done() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu);
      done = s;
      done_at = absl::Now();
    };
  }
  absl::Status Wait(absl::Duration timeout = absl::Seconds(60)) {
    absl::MutexLock lock(&mu);
    auto has = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done.has_value(); };
    if (!mu.AwaitWithTimeout(absl::Condition(&has), timeout)) return absl::DeadlineExceededError("no done callback");
    return *done;
  }
  const TrajectoryGroup* Find(const std::string& prompt_id) {
    absl::MutexLock lock(&mu);
    for (auto& [g, s] : groups) {
      if (g.prompt_id() == prompt_id) return &g;
    }
    return nullptr;
  }
};

std::unique_ptr<RolloutWorker> MakeWorker(RolloutWorkerOptions o = {}, RewardClient* reward = nullptr,
                                          ReplayBufferClient* replay = nullptr) {
  return std::make_unique<RolloutWorker>(o, std::make_unique<actor::CharTokenizer>(), reward, replay);
}

// The group's samples carry exactly the reference tokens and log-probs.
void ExpectMatches(const TrajectoryGroup& g, const actor::GroupResult& ref) {
  REQUIRE(g.samples_size() == static_cast<int>(ref.samples.size()));
  for (int i = 0; i < g.samples_size(); ++i) {
    const Trajectory& t = g.samples(i);
    const actor::Completion& c = ref.samples[i];
    INFO("group " << g.group_id() << " sample " << i);
    REQUIRE(t.response_token_ids_size() == static_cast<int>(c.tokens.size()));
    for (size_t k = 0; k < c.tokens.size(); ++k) CHECK(t.response_token_ids(k) == c.tokens[k]);
    REQUIRE(t.behaviour_logprobs_size() == static_cast<int>(c.logprobs.size()));
    for (size_t k = 0; k < c.logprobs.size(); ++k) CHECK(std::abs(t.behaviour_logprobs(k) - c.logprobs[k]) < 1e-4);
  }
}

TEST_CASE("worker generation equals actor generation for the same seed, with full trajectories") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  auto worker = MakeWorker();
  auto loaded = worker->LoadCheckpoint(dir.File("v1"), 0);
  REQUIRE(loaded.ok());
  CHECK(loaded->version == 1);
  CHECK(loaded->bytes > 0);

  GenerateRequest req = MakeRequest({"1+2=", "hello", "x"}, 3, 12, 42);
  req.set_decode_text(true);
  req.mutable_prompts(1)->mutable_metadata()->insert({"task", "greet"});
  Collector col;
  REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  auto ref = ReferenceGenerate(dir.File("v1"), req);
  REQUIRE(ref.ok());
  REQUIRE(col.groups.size() == 3);
  actor::CharTokenizer tok;
  for (int p = 0; p < 3; ++p) {
    const TrajectoryGroup* g = col.Find("q" + std::to_string(p));
    REQUIRE(g != nullptr);
    ExpectMatches(*g, (*ref)[p]);
    CHECK(g->group_id() == "exp/7/q" + std::to_string(p));
    CHECK(g->experiment_id() == "exp");
    CHECK(g->step() == 7);
    for (int i = 0; i < 3; ++i) {
      const Trajectory& t = g->samples(i);
      CHECK(t.trajectory_id() == g->group_id() + "/" + std::to_string(i));
      CHECK(t.sample_index() == i);
      CHECK(t.policy_version() == 1);
      CHECK(t.provenance().weights_version() == 1);
      CHECK(t.provenance().tokenizer_hash() == tok.Hash());
      CHECK(t.provenance().rollout_worker() == "rollout-0");
      CHECK(t.provenance().model() == dir.File("v1"));
      CHECK(t.loss_mask_size() == t.response_token_ids_size());
      for (int m : t.loss_mask()) CHECK(m == 1);
      CHECK(t.prompt_token_ids_size() == req.prompts(p).token_ids_size());
      CHECK(t.reference_answer() == std::to_string(p));
      CHECK(t.finish_reason() == FINISH_REASON_LENGTH);
      CHECK(t.generated_unix_micros() > 0);
      std::vector<int> ids(t.response_token_ids().begin(), t.response_token_ids().end());
      CHECK(t.response_text() == tok.Decode(ids, true));
    }
  }
  CHECK(col.Find("q1")->samples(0).metadata().at("task") == "greet");
  // Different seeds give different samples (the seed is really used).
  GenerateRequest other = req;
  other.mutable_sampling()->set_seed(43);
  Collector col2;
  REQUIRE(worker->Submit(other, col2.Sink(), col2.Done()).ok());
  REQUIRE(col2.Wait().ok());
  bool any_diff = false;
  for (int p = 0; p < 3; ++p) {
    const auto* a = col.Find("q" + std::to_string(p));
    const auto* b = col2.Find("q" + std::to_string(p));
    for (int i = 0; i < 3; ++i) {
      any_diff |= a->samples(i).response_token_ids().size() != b->samples(i).response_token_ids().size() ||
                  !std::equal(a->samples(i).response_token_ids().begin(), a->samples(i).response_token_ids().end(),
                              b->samples(i).response_token_ids().begin());
    }
  }
  CHECK(any_diff);
  auto status = worker->Status();
  CHECK(status.policy_version() == 1);
  CHECK(status.generated_tokens() == 2 * 3 * 3 * 12);
  REQUIRE(status.rank_parameter_bytes_size() == 1);  // one whole model
  CHECK(status.rank_parameter_bytes(0) == loaded->bytes);
}

TEST_CASE("bad input is INVALID_ARGUMENT naming the field; missing prerequisites are FAILED_PRECONDITION") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  auto worker = MakeWorker();
  auto noop_sink = [](TrajectoryGroup, bool) {};
  auto noop_done = [](absl::Status) {};
  GenerateRequest good = MakeRequest({"abc"}, 2, 4, 1);

  auto s = worker->Submit(good, noop_sink, noop_done).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);  // no weights yet
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());

  auto expect_bad = [&](GenerateRequest r, const std::string& field) {
    auto st = worker->Submit(r, noop_sink, noop_done).status();
    INFO(st.ToString());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(st.message(), field));
  };
  GenerateRequest r = good;
  r.mutable_prompts(0)->set_token_ids(1, 100000);
  expect_bad(r, "prompts[0].token_ids[1]");
  r = good;
  r.mutable_prompts(0)->clear_token_ids();
  expect_bad(r, "prompts[0].token_ids");
  r = good;
  r.set_n(0);
  expect_bad(r, "n:");
  r = good;
  r.mutable_sampling()->set_max_new_tokens(62);  // 3 + 62 > 64 positions
  expect_bad(r, "sampling.max_new_tokens");
  r = good;
  r.clear_prompts();
  expect_bad(r, "prompts");
  r = good;
  *r.add_prompts() = r.prompts(0);  // same prompt_id twice
  expect_bad(r, "prompts[1].prompt_id");

  r = good;
  r.set_pipeline(true);
  s = worker->Submit(r, noop_sink, noop_done).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(s.message(), "--reward_server"));

  r = good;
  r.set_min_policy_version(5);
  CHECK(worker->Submit(r, noop_sink, noop_done).status().code() == absl::StatusCode::kAborted);

  // Version must move forward, and "the next one" has an end.
  CHECK(worker->LoadCheckpoint(dir.File("v1"), 1).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), std::numeric_limits<int64_t>::max()).ok());
  auto next = worker->LoadCheckpoint(dir.File("v1"), 0);
  CHECK(next.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(next.status().message(), "the loaded version is the largest"));
  CHECK(worker->policy_version() == std::numeric_limits<int64_t>::max());
}

TEST_CASE("a full queue answers RESOURCE_EXHAUSTED") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  RolloutWorkerOptions o;
  o.max_queue = 1;
  o.max_batch = 4;
  auto worker = MakeWorker(o);
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  // The first request fills the batch and holds the engine in its sink
  // until released, so the second one must wait in the queue.
  absl::Notification release;
  Collector a, b;
  a.hook = [&](const TrajectoryGroup&) { release.WaitForNotificationWithTimeout(absl::Seconds(30)); };
  REQUIRE(worker->Submit(MakeRequest({"ab", "cd"}, 2, 4, 1), a.Sink(), a.Done()).ok());
  // Wait until the first is admitted, so the queue holds exactly b.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (worker->Status().queued_requests() != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  REQUIRE(worker->Submit(MakeRequest({"ef"}, 2, 4, 1), b.Sink(), b.Done()).ok());
  CHECK(worker->Status().queued_requests() == 1);
  Collector c;
  auto s = worker->Submit(MakeRequest({"gh"}, 2, 4, 1), c.Sink(), c.Done()).status();
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  release.Notify();
  CHECK(a.Wait().ok());
  CHECK(b.Wait().ok());
  // Once drained, requests are accepted again.
  CHECK(worker->Submit(MakeRequest({"gh"}, 2, 4, 1), c.Sink(), c.Done()).ok());
  CHECK(c.Wait().ok());
}

// Request A (short) ends first and its sink blocks the engine while B (long)
// is in flight; a weight update is posted meanwhile; C is submitted after it.
struct FenceRun {
  Collector a, b, c;
  absl::StatusOr<LoadResult> load;
  absl::Time load_done;
};

void RunFence(RolloutWorker& worker, const std::string& v2_dir, GenerateRequest req_b, GenerateRequest req_c,
              FenceRun* run) {
  absl::Notification release, a_reached, x_reached, queued;
  run->a.hook = [&](const TrajectoryGroup&) {
    a_reached.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(30));
  };
  // X holds the engine in its sink while A and B are queued, so both are
  // admitted in one go however the threads are scheduled (submitting A and B
  // back to back raced: on a loaded machine A could finish before B arrived).
  Collector x;
  x.hook = [&](const TrajectoryGroup&) {
    x_reached.Notify();
    queued.WaitForNotificationWithTimeout(absl::Seconds(30));
  };
  REQUIRE(worker.Submit(MakeRequest({"y"}, 1, 1, 3), x.Sink(), x.Done()).ok());
  REQUIRE(x_reached.WaitForNotificationWithTimeout(absl::Seconds(30)));
  GenerateRequest req_a = MakeRequest({"z"}, 1, 2, 5);
  REQUIRE(worker.Submit(req_a, run->a.Sink(), run->a.Done()).ok());
  REQUIRE(worker.Submit(req_b, run->b.Sink(), run->b.Done()).ok());
  REQUIRE(worker.Status().queued_requests() == 2);
  queued.Notify();
  REQUIRE(x.Wait().ok());
  REQUIRE(a_reached.WaitForNotificationWithTimeout(absl::Seconds(30)));
  REQUIRE(worker.Status().queued_requests() == 0);  // B is in flight, not queued
  std::thread loader([&] {
    run->load = worker.LoadCheckpoint(v2_dir, 2);
    run->load_done = absl::Now();
  });
  // Wait until the update is posted at the fence (the engine is held in A's sink).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (worker.Status().pending_update_version() != 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  REQUIRE(worker.Status().pending_update_version() == 2);
  REQUIRE(worker.Submit(req_c, run->c.Sink(), run->c.Done()).ok());
  release.Notify();
  loader.join();
  REQUIRE(run->a.Wait().ok());
  REQUIRE(run->b.Wait().ok());
  REQUIRE(run->c.Wait().ok());
  REQUIRE(run->load.ok());
}

TEST_CASE("version fencing (finish): in-flight sequences finish on the old weights, later ones use the new") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("v2"), 2).ok());
  auto worker = MakeWorker();
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  GenerateRequest req_b = MakeRequest({"long one"}, 2, 40, 9);
  GenerateRequest req_c = MakeRequest({"long one"}, 2, 40, 9);
  FenceRun run;
  RunFence(*worker, dir.File("v2"), req_b, req_c, &run);

  const TrajectoryGroup* b = run.b.Find("q0");
  const TrajectoryGroup* c = run.c.Find("q0");
  REQUIRE(b != nullptr);
  REQUIRE(c != nullptr);
  for (const auto& t : b->samples()) CHECK(t.policy_version() == 1);
  for (const auto& t : c->samples()) CHECK(t.policy_version() == 2);
  // B's tokens are exactly what v1 alone produces (nothing of v2 mixed in),
  // C's what v2 alone produces; the two differ.
  auto ref1 = ReferenceGenerate(dir.File("v1"), req_b);
  auto ref2 = ReferenceGenerate(dir.File("v2"), req_c);
  REQUIRE(ref1.ok());
  REQUIRE(ref2.ok());
  ExpectMatches(*b, (*ref1)[0]);
  ExpectMatches(*c, (*ref2)[0]);
  CHECK(b->samples(0).response_token_ids().size() == 40);
  CHECK_FALSE(std::equal(b->samples(0).response_token_ids().begin(), b->samples(0).response_token_ids().end(),
                         c->samples(0).response_token_ids().begin()));
  // The swap waited for B.
  CHECK(run.load_done >= run.b.done_at);
  CHECK(run.load->version == 2);
  CHECK(worker->policy_version() == 2);
}

TEST_CASE("version fencing (partial): in-flight sequences are interrupted and continued on the new weights") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("v2"), 2).ok());
  RolloutWorkerOptions o;
  o.on_update = RolloutWorkerOptions::OnUpdate::kPartial;
  auto worker = MakeWorker(o);
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  GenerateRequest req_b = MakeRequest({"long one"}, 2, 40, 9);
  GenerateRequest req_c = MakeRequest({"long one"}, 2, 40, 9);
  FenceRun run;
  RunFence(*worker, dir.File("v2"), req_b, req_c, &run);
  const TrajectoryGroup* b = run.b.Find("q0");
  const TrajectoryGroup* c = run.c.Find("q0");
  REQUIRE(b != nullptr);
  REQUIRE(c != nullptr);
  REQUIRE(b->samples_size() == 2);
  // B began on v1 and, after the swap, went on from its tokens on v2: the
  // first k tokens (and their log-probs) are v1's, the rest what v2 samples
  // when resuming from them.
  auto ref1 = ReferenceGenerate(dir.File("v1"), req_b);
  REQUIRE(ref1.ok());
  std::vector<std::vector<actor::Completion>> resume(1);
  for (int i = 0; i < b->samples_size(); ++i) {
    const Trajectory& t = b->samples(i);
    INFO("sample " << i);
    CHECK(t.finish_reason() == FINISH_REASON_LENGTH);
    CHECK(t.response_token_ids_size() == 40);
    CHECK(t.policy_version() == 1);
    REQUIRE(t.version_switches_size() == 1);
    CHECK(t.version_switches(0).policy_version() == 2);
    const int k = t.version_switches(0).token_index();
    CHECK(k > 0);
    CHECK(k < 40);
    const actor::Completion& v1 = (*ref1)[0].samples[i];
    actor::Completion partial;
    partial.sample_index = i;
    partial.finish_reason = actor::FinishReason::kAborted;
    partial.tokens.assign(v1.tokens.begin(), v1.tokens.begin() + k);
    partial.logprobs.assign(v1.logprobs.begin(), v1.logprobs.begin() + k);
    resume[0].push_back(partial);
  }
  auto resumed = ReferenceGenerate(dir.File("v2"), req_b, 64, &resume);
  REQUIRE(resumed.ok());
  ExpectMatches(*b, (*resumed)[0]);
  auto ref2 = ReferenceGenerate(dir.File("v2"), req_c);
  REQUIRE(ref2.ok());
  ExpectMatches(*c, (*ref2)[0]);
  for (const auto& t : c->samples()) CHECK(t.policy_version() == 2);
}

TEST_CASE("version fencing (abort): in-flight sequences are regenerated on the new weights, never mixed") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("v2"), 2).ok());
  RolloutWorkerOptions o;
  o.on_update = RolloutWorkerOptions::OnUpdate::kAbort;
  auto worker = MakeWorker(o);
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  GenerateRequest req_b = MakeRequest({"long one"}, 2, 40, 9);
  GenerateRequest req_c = MakeRequest({"long one"}, 2, 40, 9);
  FenceRun run;
  RunFence(*worker, dir.File("v2"), req_b, req_c, &run);
  const TrajectoryGroup* b = run.b.Find("q0");
  REQUIRE(b != nullptr);
  // B was cut on v1 and started over on v2: exactly v2's own tokens.
  auto ref2 = ReferenceGenerate(dir.File("v2"), req_b);
  REQUIRE(ref2.ok());
  ExpectMatches(*b, (*ref2)[0]);
  for (const auto& t : b->samples()) {
    CHECK(t.policy_version() == 2);
    CHECK(t.version_switches_size() == 0);
    CHECK(t.response_token_ids_size() == 40);
  }
  CHECK(ParseOnUpdate("partial").value() == RolloutWorkerOptions::OnUpdate::kPartial);
  CHECK(ParseOnUpdate("sometimes").status().code() == absl::StatusCode::kInvalidArgument);
}

// Joins `worker` to an in-process sync group named `group` and returns its
// publisher.
std::unique_ptr<weight_sync::WeightPublisher> InProcessSync(RolloutWorker& worker, const std::string& group) {
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_IN_PROCESS);
  spec.set_group_name(group);
  spec.set_timeout_ms(5000);
  REQUIRE(worker.ConfigureWeightSync(spec).ok());
  auto pub = CreateWeightPublisher(spec);
  REQUIRE(pub.ok());
  return std::move(*pub);
}

// The weights of the checkpoint folder `dir`, by Hugging Face name.
NamedTensors CheckpointWeights(const std::string& dir) {
  auto model = actor::LoadHfModel(dir);
  REQUIRE(model.ok());
  NamedTensors named;
  for (auto& [n, t] : (*model)->NamedParameters()) named.emplace_back(n, t);
  return named;
}

TEST_CASE("weights through the in-process sync change the output and bump the version") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("v2"), 2).ok());
  auto worker = MakeWorker();
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  auto pub = InProcessSync(*worker, "rw-test");
  NamedTensors named = CheckpointWeights(dir.File("v2"));
  auto layout = pub->Publish(named, 5);
  REQUIRE(layout.ok());
  auto r = worker->LoadFromSync(*layout, 0);
  REQUIRE(r.ok());
  CHECK(r->version == 5);
  CHECK(worker->policy_version() == 5);

  GenerateRequest req = MakeRequest({"abc"}, 2, 10, 3);
  Collector col;
  REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  auto ref = ReferenceGenerate(dir.File("v2"), req);
  REQUIRE(ref.ok());
  ExpectMatches(*col.Find("q0"), (*ref)[0]);
  CHECK(col.Find("q0")->samples(0).policy_version() == 5);

  // A layout with a tensor the model lacks is refused and changes nothing.
  named.emplace_back("extra.weight", at::zeros({2}));
  REQUIRE(pub->Publish(named, 6).ok());
  WeightLayout want;
  want.set_version(6);
  auto bad = worker->LoadFromSync(want, 0);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(bad.status().message(), "extra.weight"));
  CHECK(worker->policy_version() == 5);
}

// A LoRA stage's sync: only the adapters (B scaled), applied on the base the
// worker loaded; the worker then generates what the base + adapter folder
// generates, and an adapter of a layer the model lacks is refused by name.
TEST_CASE("an adapter-only (LoRA) sync runs the adapters on the loaded base") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("base"), 1).ok());
  NamedTensors adapters;
  {
    auto model = actor::LoadHfModel(dir.File("base"));
    REQUIRE(model.ok());
    actor::LoraSpec spec;
    spec.rank = 2;
    spec.alpha = 4;
    spec.targets = {"q_proj", "v_proj", "down_proj"};
    REQUIRE(actor::AttachLora(*model, spec).ok());
    at::NoGradGuard no_grad;
    for (auto& [n, t] : (*model)->AdapterParameters()) {
      t.normal_(0.0, 0.5);
      const bool b = n.find("lora_B") != std::string::npos;
      adapters.emplace_back(n, b ? t * spec.Scaling() : t.clone());
    }
    REQUIRE(actor::SaveHfModel(*model, dir.File("lora")).ok());
  }
  auto worker = MakeWorker();
  REQUIRE(worker->LoadCheckpoint(dir.File("base"), 1).ok());
  auto pub = InProcessSync(*worker, "rw-lora");
  auto layout = pub->Publish(adapters, 2);
  REQUIRE(layout.ok());
  auto r = worker->LoadFromSync(*layout, 0);
  REQUIRE(r.ok());
  int64_t bytes = 0;
  for (const auto& [n, t] : adapters) bytes += static_cast<int64_t>(t.nbytes());
  CHECK(r->bytes == bytes);

  GenerateRequest req = MakeRequest({"abc"}, 2, 10, 3);
  Collector col;
  REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  auto with = ReferenceGenerate(dir.File("lora"), req);
  REQUIRE(with.ok());
  ExpectMatches(*col.Find("q0"), (*with)[0]);
  // The adapters change what is generated (the match above is not the
  // base's).
  auto base = ReferenceGenerate(dir.File("base"), req);
  REQUIRE(base.ok());
  CHECK((*base)[0].samples[0].tokens != (*with)[0].samples[0].tokens);

  NamedTensors bad = adapters;
  bad[0].first = "model.layers.0.self_attn.rope.lora_A.weight";
  REQUIRE(pub->Publish(bad, 3).ok());
  WeightLayout want;
  want.set_version(3);
  auto refused = worker->LoadFromSync(want, 0);
  INFO(refused.status().message());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(refused.status().message(), "self_attn.rope.lora_A.weight"));
  CHECK(worker->policy_version() == 2);
}

// A bf16 worker says so, takes bf16 from a publisher that casts its fp32
// weights, generates with them, and refuses fp32 by name.
TEST_CASE("a bf16 worker: the sync must carry bf16, which the publisher casts to") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("v2"), 2).ok());
  RolloutWorkerOptions o;
  o.dtype = "bf16";
  auto worker = MakeWorker(o);
  CHECK(worker->WeightDtype() == "bf16");
  CHECK(MakeWorker()->WeightDtype() == "f32");
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  const NamedTensors fp32 = CheckpointWeights(dir.File("v2"));

  auto plain = InProcessSync(*worker, "rw-bf16-plain");
  REQUIRE(plain->Publish(fp32, 2).ok());
  WeightLayout v2;
  v2.set_version(2);
  auto refused = worker->LoadFromSync(v2, 0);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(refused.status().message(), "].dtype: Float but this worker's model holds BFloat16"));
  CHECK(worker->policy_version() == 1);

  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_IN_PROCESS);
  spec.set_group_name("rw-bf16-cast");
  spec.set_timeout_ms(5000);
  REQUIRE(worker->ConfigureWeightSync(spec).ok());
  spec.set_dtype(worker->WeightDtype());
  auto cast = CreateWeightPublisher(spec);
  REQUIRE(cast.ok());
  REQUIRE((*cast)->Publish(fp32, 3).ok());
  WeightLayout v3;
  v3.set_version(3);
  auto loaded = worker->LoadFromSync(v3, 0);
  REQUIRE(loaded.ok());
  int64_t fp32_bytes = 0;
  for (const auto& [n, t] : fp32) fp32_bytes += static_cast<int64_t>(t.nbytes());
  CHECK(loaded->bytes * 2 == fp32_bytes);

  // It generates what a bf16 load of the same folder generates.
  RolloutWorkerOptions ref_options;
  ref_options.dtype = "bf16";
  auto reference = MakeWorker(ref_options);
  REQUIRE(reference->LoadCheckpoint(dir.File("v2"), 3).ok());
  GenerateRequest req = MakeRequest({"abc"}, 2, 10, 3);
  Collector a, b;
  REQUIRE(worker->Submit(req, a.Sink(), a.Done()).ok());
  REQUIRE(a.Wait().ok());
  REQUIRE(reference->Submit(req, b.Sink(), b.Done()).ok());
  REQUIRE(b.Wait().ok());
  const TrajectoryGroup& got = *a.Find("q0");
  const TrajectoryGroup& want = *b.Find("q0");
  REQUIRE(got.samples_size() == want.samples_size());
  for (int i = 0; i < got.samples_size(); ++i) {
    CHECK(std::vector<int>(got.samples(i).response_token_ids().begin(), got.samples(i).response_token_ids().end()) ==
          std::vector<int>(want.samples(i).response_token_ids().begin(), want.samples(i).response_token_ids().end()));
    CHECK(got.samples(i).policy_version() == 3);
  }
}

TEST_CASE("tensor_parallel=2: the split policy generates the whole model's tokens, across a fence and a sync") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("v2"), 2).ok());
  RolloutWorkerOptions o;
  o.tensor_parallel = 2;
  o.on_update = RolloutWorkerOptions::OnUpdate::kAbort;
  auto worker = MakeWorker(o);
  auto loaded = worker->LoadCheckpoint(dir.File("v1"), 1);
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  // Two ranks, each with about half the weights (the norms are whole).
  const RolloutStatus status = worker->Status();
  REQUIRE(status.rank_parameter_bytes_size() == 2);
  for (int64_t b : status.rank_parameter_bytes()) CHECK(b < 0.55 * loaded->bytes);

  GenerateRequest req = MakeRequest({"1+2=", "hello", "x"}, 3, 12, 42);
  {
    Collector col;
    REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
    REQUIRE(col.Wait().ok());
    auto ref = ReferenceGenerate(dir.File("v1"), req);
    REQUIRE(ref.ok());
    for (int p = 0; p < 3; ++p) {
      const TrajectoryGroup* g = col.Find("q" + std::to_string(p));
      REQUIRE(g != nullptr);
      ExpectMatches(*g, (*ref)[p]);
    }
  }

  // A checkpoint swap while a group decodes: it is cut and regenerated on
  // v2's slices (on_update: abort), as one whole model would.
  GenerateRequest req_b = MakeRequest({"long one"}, 2, 40, 9);
  GenerateRequest req_c = MakeRequest({"long one"}, 2, 40, 9);
  FenceRun run;
  RunFence(*worker, dir.File("v2"), req_b, req_c, &run);
  auto ref2 = ReferenceGenerate(dir.File("v2"), req_b);
  REQUIRE(ref2.ok());
  REQUIRE(run.b.Find("q0") != nullptr);
  ExpectMatches(*run.b.Find("q0"), (*ref2)[0]);
  for (const auto& t : run.b.Find("q0")->samples()) CHECK(t.policy_version() == 2);

  // Weight sync: every rank reloads its slice of the received tensors.
  auto pub = InProcessSync(*worker, "rw-tp-test");
  auto layout = pub->Publish(CheckpointWeights(dir.File("v1")), 7);
  REQUIRE(layout.ok());
  auto r = worker->LoadFromSync(*layout, 0);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  Collector col;
  REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  auto ref = ReferenceGenerate(dir.File("v1"), req);
  REQUIRE(ref.ok());
  ExpectMatches(*col.Find("q1"), (*ref)[1]);
  CHECK(col.Find("q1")->samples(0).policy_version() == 7);
}

// Generates `req` on `worker` and checks every prompt's tokens against the
// folder's weights, at weights version `version`.
void ExpectGenerates(RolloutWorker& worker, const GenerateRequest& req, const std::string& dir, int64_t version) {
  Collector col;
  REQUIRE(worker.Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  auto ref = ReferenceGenerate(dir, req);
  REQUIRE(ref.ok());
  for (int p = 0; p < req.prompts_size(); ++p) {
    const TrajectoryGroup* g = col.Find("q" + std::to_string(p));
    REQUIRE(g != nullptr);
    ExpectMatches(*g, (*ref)[p]);
    CHECK(g->samples(0).policy_version() == version);
  }
}

TEST_CASE("sleep: the cache or the weights go while idle, Generate waits for a load, and the tokens do not change") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("v2"), 2).ok());
  for (int tp : {1, 2}) {
    INFO("tensor_parallel " << tp);
    RolloutWorkerOptions o;
    o.tensor_parallel = tp;
    auto worker = MakeWorker(o);
    auto early = worker->Sleep(true);
    CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
    auto pub = InProcessSync(*worker, absl::StrCat("rw-sleep-", tp));
    REQUIRE(pub->Publish(CheckpointWeights(dir.File("v2")), 2).ok());
    WeightLayout want;
    want.set_version(2);
    auto synced = worker->LoadFromSync(want, 0);
    REQUIRE(synced.ok());
    GenerateRequest req = MakeRequest({"1+2=", "hello"}, 3, 12, 42);
    ExpectGenerates(*worker, req, dir.File("v2"), 2);

    // The cache only: the weights stay, generation goes on as before.
    auto cache = worker->Sleep(false);
    REQUIRE(cache.ok());
    CHECK(cache->released_bytes == 0);
    CHECK_FALSE(worker->Status().weights_released());
    ExpectGenerates(*worker, req, dir.File("v2"), 2);

    // The weights: every rank's parameters, and (one rank) the receive
    // buffers, which hold the model once more.
    int64_t params = 0;
    const RolloutStatus status = worker->Status();
    for (int64_t b : status.rank_parameter_bytes()) params += b;
    REQUIRE(params > 0);
    auto weights = worker->Sleep(true);
    REQUIRE(weights.ok());
    CHECK(weights->released_bytes == (tp == 1 ? 2 * params : params));
    CHECK(worker->Status().weights_released());
    CHECK(worker->policy_version() == 2);
    Collector refused;
    auto submitted = worker->Submit(req, refused.Sink(), refused.Done());
    CHECK(submitted.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(submitted.status().message(), "Sleep"));
    auto again = worker->Sleep(true);
    REQUIRE(again.ok());
    CHECK(again->released_bytes == 0);
    CHECK(worker->Status().weights_released());

    // A sync wakes it with the sync's weights, twice (fresh receive buffers,
    // then reused ones).
    REQUIRE(pub->Publish(CheckpointWeights(dir.File("v1")), 3).ok());
    want.set_version(3);
    REQUIRE(worker->LoadFromSync(want, 0).ok());
    CHECK_FALSE(worker->Status().weights_released());
    ExpectGenerates(*worker, req, dir.File("v1"), 3);
    REQUIRE(pub->Publish(CheckpointWeights(dir.File("v2")), 4).ok());
    want.set_version(4);
    REQUIRE(worker->LoadFromSync(want, 0).ok());
    ExpectGenerates(*worker, req, dir.File("v2"), 4);

    // A checkpoint wakes it too.
    REQUIRE(worker->Sleep(true).ok());
    REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 5).ok());
    ExpectGenerates(*worker, req, dir.File("v1"), 5);
  }
}

TEST_CASE("sleep: a worker busy generating is refused, and one that released its weights gives the memory back") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  {
    // The first request's delivery holds the engine until the Sleep is
    // posted; the second waits in the queue (max_batch 2), so at the fence
    // the worker is not idle.
    RolloutWorkerOptions o;
    o.max_batch = 2;
    auto worker = MakeWorker(o);
    REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
    absl::Notification go;
    std::atomic<bool> first{true};
    Collector col1, col2;
    col1.hook = [&](const TrajectoryGroup&) {
      if (first.exchange(false)) go.WaitForNotificationWithTimeout(absl::Seconds(30));
    };
    REQUIRE(worker->Submit(MakeRequest({"a"}, 2, 8, 7), col1.Sink(), col1.Done()).ok());
    REQUIRE(worker->Submit(MakeRequest({"b"}, 2, 8, 8), col2.Sink(), col2.Done()).ok());
    absl::StatusOr<SleepResult> busy = absl::UnknownError("not run");
    std::thread sleeper([&] { busy = worker->Sleep(true); });
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (worker->Status().pending_update_version() == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    go.Notify();
    sleeper.join();
    CHECK(busy.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(busy.status().message(), "idle"));
    CHECK_FALSE(worker->Status().weights_released());
    REQUIRE(col1.Wait().ok());
    REQUIRE(col2.Wait().ok());
    CHECK(worker->Sleep(true).ok());
  }
  // A policy of ~70 MB: released with its receive buffers (~140 MB), the
  // process's resident set falls by most of that.
  actor::CharTokenizer tok;
  actor::ModelConfig c;
  c.vocab_size = tok.vocab_size();
  c.hidden_size = 512;
  c.intermediate_size = 1408;
  c.num_layers = 6;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.max_positions = 64;
  c.eos_token_id = tok.eos_id();
  {
    at::manual_seed(3);
    actor::Transformer model(c);
    REQUIRE(actor::SaveHfModel(model, dir.File("big")).ok());
  }
  auto worker = MakeWorker();
  REQUIRE(worker->LoadCheckpoint(dir.File("big"), 1).ok());
  auto pub = InProcessSync(*worker, "rw-sleep-memory");
  REQUIRE(pub->Publish(CheckpointWeights(dir.File("big")), 2).ok());
  WeightLayout want;
  want.set_version(2);
  REQUIRE(worker->LoadFromSync(want, 0).ok());
  const int64_t params = worker->Status().rank_parameter_bytes(0);
  REQUIRE(params > 60'000'000);
  auto slept = worker->Sleep(true);
  REQUIRE(slept.ok());
  CHECK(slept->released_bytes == 2 * params);
  INFO("resident before " << slept->memory_before << " after " << slept->memory_after);
  CHECK(slept->memory_before - slept->memory_after > 0.8 * slept->released_bytes);
  REQUIRE(pub->Publish(CheckpointWeights(dir.File("big")), 3).ok());
  want.set_version(3);
  REQUIRE(worker->LoadFromSync(want, 0).ok());
  ExpectGenerates(*worker, MakeRequest({"abc"}, 2, 4, 1), dir.File("big"), 3);
}

// Publishes `weights` as version `v` in spec.pieces pieces, each into its
// own in-process group, cut as a learner split over `learner_tp` ranks
// would cut them: rank t's slice first, then its pieces.
void PublishPieces(const WeightSyncSpec& spec, const NamedTensors& weights, int learner_tp, int64_t v) {
  const int per_rank = spec.pieces() / learner_tp;
  for (int c = 0; c < spec.pieces(); ++c) {
    const int t = c / per_rank;
    NamedTensors piece;
    for (const auto& [name, whole] : weights) {
      auto slice = parallel::TensorParallelPiece(name, whole, 0, 1, t, learner_tp);
      REQUIRE(slice.ok());
      auto p = parallel::TensorParallelPiece(name, *slice, t, learner_tp, c, spec.pieces());
      REQUIRE(p.ok());
      piece.emplace_back(name, *p);
    }
    auto pub = CreateWeightPublisher(weight_sync::PieceSpec(spec, c));
    REQUIRE(pub.ok());
    REQUIRE((*pub)->Publish(piece, v).ok());
  }
}

TEST_CASE("weight sync in pieces: each rank joins its own pieces, and the worker generates the sync's weights") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("v2"), 2).ok());
  const NamedTensors v2 = CheckpointWeights(dir.File("v2"));
  GenerateRequest req = MakeRequest({"1+2=", "hello"}, 2, 12, 42);
  auto ref = ReferenceGenerate(dir.File("v2"), req);
  REQUIRE(ref.ok());
  // {learner tp, rollout tp}: a split rollout from a whole learner and from
  // one split alike (each rollout rank receives its one piece), and a whole
  // rollout from a split learner (its one rank joins both pieces).
  for (auto [learner_tp, rollout_tp] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{2, 1}}) {
    INFO("learner tp " << learner_tp << ", rollout tp " << rollout_tp);
    RolloutWorkerOptions o;
    o.tensor_parallel = rollout_tp;
    auto worker = MakeWorker(o);
    REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
    WeightSyncSpec spec;
    spec.set_backend(WEIGHT_SYNC_IN_PROCESS);
    spec.set_group_name(absl::StrCat("rw-pieces-", learner_tp, "-", rollout_tp));
    spec.set_timeout_ms(5000);
    spec.set_pieces(weight_sync::WeightPieces(learner_tp, rollout_tp));
    REQUIRE(spec.pieces() == 2);
    REQUIRE(worker->ConfigureWeightSync(spec).ok());
    PublishPieces(spec, v2, learner_tp, 4);
    WeightLayout want;
    want.set_version(4);
    auto r = worker->LoadFromSync(want, 0);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->version == 4);
    int64_t whole = 0;
    for (const auto& [n, t] : v2) whole += static_cast<int64_t>(t.nbytes());
    // The ranks received their slices once: the whole model's bytes, plus
    // the replicated norms once more per extra rank.
    CHECK(r->bytes >= whole);
    CHECK(r->bytes < whole + whole / 10);
    Collector col;
    REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
    REQUIRE(col.Wait().ok());
    for (int p = 0; p < 2; ++p) {
      const TrajectoryGroup* g = col.Find("q" + std::to_string(p));
      REQUIRE(g != nullptr);
      ExpectMatches(*g, (*ref)[p]);
      CHECK(g->samples(0).policy_version() == 4);
    }

    // A piece the model cannot hold (another shape) is refused by name and
    // changes nothing.
    NamedTensors wrong = v2;
    for (auto& [n, t] : wrong) {
      if (absl::EndsWith(n, "up_proj.weight")) t = at::zeros({t.size(0) + 2, t.size(1)});
    }
    PublishPieces(spec, wrong, learner_tp, 5);
    want.set_version(5);
    auto bad = worker->LoadFromSync(want, 0);
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(bad.status().message(), "up_proj.weight"));
    CHECK(worker->policy_version() == 4);
  }

  // Pieces that do not give every rank a whole number of them.
  RolloutWorkerOptions o;
  o.tensor_parallel = 2;
  auto worker = MakeWorker(o);
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_IN_PROCESS);
  spec.set_group_name("rw-pieces-3");
  spec.set_pieces(3);
  auto s = worker->ConfigureWeightSync(spec);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "spec.pieces"));
  // A sync in pieces before any checkpoint gave the model its shape: the
  // pieces are drained, then refused as such.
  spec.set_pieces(2);
  spec.set_group_name("rw-pieces-early");
  spec.set_timeout_ms(5000);
  REQUIRE(worker->ConfigureWeightSync(spec).ok());
  PublishPieces(spec, v2, 2, 3);
  WeightLayout want;
  want.set_version(3);
  auto early = worker->LoadFromSync(want, 0);
  CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(early.status().message(), "no model loaded"));
  // Nobody publishes: one timeout, not one per piece (8 pieces over 2 ranks
  // at 500 ms each would be 2 s).
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  spec.set_pieces(8);
  spec.set_group_name("rw-pieces-silent");
  spec.set_timeout_ms(500);
  REQUIRE(worker->ConfigureWeightSync(spec).ok());
  const absl::Time t0 = absl::Now();
  auto silent = worker->LoadFromSync(want, 0);
  CHECK(silent.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - t0 < absl::Milliseconds(1500));
}

TEST_CASE("tensor_parallel: what cannot be split is refused by name") {
  RolloutWorkerOptions o;
  o.tensor_parallel = 2;
  o.device = "cuda";
  CHECK(absl::StrContains(o.Validate().message(), "tensor_parallel"));
  o.device = "cpu";
  o.tensor_parallel = 0;
  CHECK(absl::StrContains(o.Validate().message(), "tensor_parallel"));
  o.tensor_parallel = 2;
  REQUIRE(o.Validate().ok());
  // The tiny model's 2 KV heads do not split over 4 ranks.
  o.tensor_parallel = 4;
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  auto worker = MakeWorker(o);
  auto loaded = worker->LoadCheckpoint(dir.File("v1"), 1);
  CHECK(loaded.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(absl::StrContains(loaded.status().message(), "tensor_parallel=4"));
  CHECK(absl::StrContains(loaded.status().message(), "num_kv_heads"));
  CHECK(worker->policy_version() == 0);
}

TEST_CASE("cuda_graphs is refused by name off a CUDA device or with tensor_parallel") {
  RolloutWorkerOptions o;
  o.cuda_graphs = true;
  CHECK(absl::StrContains(o.Validate().message(), "cuda_graphs: needs a CUDA device and tensor_parallel 1 (got \"cpu\", 1)"));
  o.device = "cuda:0";
  CHECK(o.Validate().ok());
}

class FakeReward : public RewardClient {
 public:
  absl::StatusOr<ScoreResponse> Score(const ScoreRequest& request, absl::Duration timeout) override {
    calls++;
    if (fail) return absl::UnavailableError("reward server down");
    if (hang) {
      // Stuck until the call's deadline; 20 s at most, so a caller that
      // sets none fails its test instead of hanging it.
      absl::Notification never;
      never.WaitForNotificationWithTimeout(std::min(timeout, absl::Seconds(20)));
      return absl::DeadlineExceededError("fake reward server: stuck");
    }
    last_verifiers = request.verifiers_size();
    ScoreResponse r;
    r.set_reward_source("fake:length");
    for (const auto& item : request.items()) {
      ScoreResult* res = r.add_results();
      res->set_item_id(item.item_id());
      res->set_reward(item.completion_token_ids_size() * 0.5);
      (*res->mutable_components())["length"] = item.completion_token_ids_size();
    }
    return r;
  }
  std::atomic<int> calls{0};
  std::atomic<bool> fail{false};
  std::atomic<bool> hang{false};
  std::atomic<int> last_verifiers{0};
};

class FakeReplay : public ReplayBufferClient {
 public:
  absl::StatusOr<PutGroupsResponse> PutGroups(const PutGroupsRequest& request) override {
    absl::MutexLock lock(&mu);
    for (const auto& g : request.groups()) stored.push_back(g);
    PutGroupsResponse r;
    r.set_written(request.groups_size());
    return r;
  }
  absl::StatusOr<SampleGroupsResponse> SampleGroups(const SampleGroupsRequest&, absl::Duration) override {
    return absl::UnimplementedError("the rollout worker never samples");
  }
  absl::Status AckSample(const AckSampleRequest&) override {
    return absl::UnimplementedError("the rollout worker never acknowledges");
  }
  absl::Mutex mu;
  std::vector<TrajectoryGroup> stored;
};

TEST_CASE("pipeline mode scores, stores and streams each group with stored=true") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  FakeReward reward;
  FakeReplay replay;
  auto worker = MakeWorker({}, &reward, &replay);
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  GenerateRequest req = MakeRequest({"1+1=", "2+2=", "3+3="}, 2, 6, 11);
  req.set_pipeline(true);
  req.add_verifiers()->set_name("length");
  Collector col;
  REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  REQUIRE(col.groups.size() == 3);
  for (auto& [g, stored] : col.groups) {
    CHECK(stored);
    for (const auto& t : g.samples()) {
      CHECK(t.reward() == Approx(t.response_token_ids_size() * 0.5));
      CHECK(t.reward_components().at("length") == t.response_token_ids_size());
      CHECK(t.provenance().reward_source() == "fake:length");
      CHECK(t.scored_unix_micros() >= t.generated_unix_micros());
    }
  }
  CHECK(reward.last_verifiers == 1);
  absl::MutexLock lock(&replay.mu);
  REQUIRE(replay.stored.size() == 3);
  for (const auto& g : replay.stored) CHECK(g.samples(0).provenance().reward_source() == "fake:length");
}

TEST_CASE("pipeline: a group the reward server cannot take is returned unstored and counted") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  FakeReward reward;
  reward.fail = true;
  FakeReplay replay;
  auto worker = MakeWorker({}, &reward, &replay);
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  GenerateRequest req = MakeRequest({"a", "b"}, 2, 4, 11);
  req.set_pipeline(true);
  Collector col;
  REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
  auto s = col.Wait();
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(s.message(), "reward server"));
  REQUIRE(col.groups.size() == 2);  // no group is lost
  for (auto& [g, stored] : col.groups) CHECK_FALSE(stored);
  CHECK(worker->Status().failed_groups() == 2);
  absl::MutexLock lock(&replay.mu);
  CHECK(replay.stored.empty());
}

TEST_CASE("pipeline: a reward server that hangs is cut by reward_call.timeout_ms and its policy applied") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  FakeReward reward;
  reward.hang = true;
  FakeReplay replay;
  auto worker = MakeWorker({}, &reward, &replay);
  REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
  for (const std::string policy : {"zero", "drop_group"}) {
    INFO("on_failure " << policy);
    GenerateRequest req = MakeRequest({"a", "b"}, 2, 4, 11);
    req.set_pipeline(true);
    req.mutable_reward_call()->set_on_failure(policy);
    req.mutable_reward_call()->set_timeout_ms(100);
    req.mutable_reward_call()->set_breaker_failures(0);
    Collector col;
    const absl::Time start = absl::Now();
    REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
    // The fake hangs 20 s when no deadline cuts it.
    REQUIRE(col.Wait(absl::Seconds(15)).ok());
    CHECK(absl::Now() - start < absl::Seconds(10));
    REQUIRE(col.groups.size() == 2);
    absl::MutexLock lock(&replay.mu);
    if (policy == "zero") {
      for (auto& [g, stored] : col.groups) {
        CHECK(stored);
        for (const auto& t : g.samples()) {
          CHECK(t.reward() == 0);
          CHECK(t.provenance().reward_source() == "failed");
        }
      }
      CHECK(replay.stored.size() == 2);
    } else {
      for (auto& [g, stored] : col.groups) CHECK_FALSE(stored);  // and the call still ended OK
      CHECK(replay.stored.size() == 2);                          // nothing more stored
      CHECK(worker->Status().dropped_groups() == 2);
      CHECK(worker->Status().failed_groups() == 0);
    }
  }
}

TEST_CASE("cancel and shutdown end requests exactly once") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(WriteTinyCheckpoint(dir.File("v1"), 1).ok());
  Collector a, b;
  {
    RolloutWorkerOptions o;
    o.max_batch = 2;
    auto worker = MakeWorker(o);
    REQUIRE(worker->LoadCheckpoint(dir.File("v1"), 1).ok());
    absl::Notification release;
    a.hook = [&](const TrajectoryGroup&) { release.WaitForNotificationWithTimeout(absl::Seconds(30)); };
    REQUIRE(worker->Submit(MakeRequest({"a"}, 2, 4, 1), a.Sink(), a.Done()).ok());
    auto hb = worker->Submit(MakeRequest({"b"}, 2, 4, 1), b.Sink(), b.Done());
    REQUIRE(hb.ok());
    worker->Cancel(*hb);  // still queued behind a
    CHECK(b.Wait(absl::Seconds(5)).code() == absl::StatusCode::kCancelled);
    release.Notify();
    CHECK(a.Wait().ok());
  }
  CHECK(b.groups.empty());
}

TEST_CASE("record_routing: each trajectory carries its sample's MoE routes, only when asked") {
  ::rlmesh::testing::TempDir dir;
  REQUIRE(testing::WriteTinyMoeCheckpoint(dir.File("moe"), 3).ok());
  REQUIRE(WriteTinyCheckpoint(dir.File("dense"), 1).ok());
  auto worker = MakeWorker();
  REQUIRE(worker->LoadCheckpoint(dir.File("moe"), 1).ok());
  GenerateRequest req = MakeRequest({"1+2=", "hello"}, 3, 8, 42);
  req.set_record_routing(true);
  Collector col;
  REQUIRE(worker->Submit(req, col.Sink(), col.Done()).ok());
  REQUIRE(col.Wait().ok());
  auto ref = ReferenceGenerate(dir.File("moe"), req);
  REQUIRE(ref.ok());
  for (int p = 0; p < 2; ++p) {
    const TrajectoryGroup* g = col.Find("q" + std::to_string(p));
    REQUIRE(g != nullptr);
    ExpectMatches(*g, (*ref)[p]);
    for (int i = 0; i < g->samples_size(); ++i) {
      const Trajectory& t = g->samples(i);
      // [prompt + response - 1 positions][2 MoE layers][k = 2].
      CHECK(t.routes_size() == (t.prompt_token_ids_size() + t.response_token_ids_size() - 1) * 2 * 2);
      CHECK(std::vector<int32_t>(t.routes().begin(), t.routes().end()) == (*ref)[p].samples[i].routes);
    }
  }
  // Not asked: no routes (they cost (P + R - 1) x layers x k ids a sample).
  req.set_record_routing(false);
  Collector off;
  REQUIRE(worker->Submit(req, off.Sink(), off.Done()).ok());
  REQUIRE(off.Wait().ok());
  for (auto& [g, stored] : off.groups) {
    for (const auto& t : g.samples()) CHECK(t.routes_size() == 0);
  }
  // A dense model has nothing to record.
  auto dense_worker = MakeWorker();
  REQUIRE(dense_worker->LoadCheckpoint(dir.File("dense"), 1).ok());
  req.set_record_routing(true);
  Collector dense;
  REQUIRE(dense_worker->Submit(req, dense.Sink(), dense.Done()).ok());
  REQUIRE(dense.Wait().ok());
  REQUIRE(dense.groups.size() == 2);
  for (auto& [g, stored] : dense.groups) {
    for (const auto& t : g.samples()) CHECK(t.routes_size() == 0);
  }
}

}  // namespace
}  // namespace rlmesh::rollout
