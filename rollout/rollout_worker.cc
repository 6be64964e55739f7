#include "rollout/rollout_worker.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "actor/checkpoint.h"
#include "actor/generate.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "weight_sync/weight_sync.h"

namespace rlmesh::rollout {

using weight_sync::CreateWeightPublisher;
using weight_sync::CreateWeightReceiver;
using weight_sync::NamedTensors;
using weight_sync::WeightReceiver;
using weight_sync::WeightSyncStore;
namespace {

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

FinishReason ToProto(actor::FinishReason r) {
  switch (r) {
    case actor::FinishReason::kStop: return FINISH_REASON_STOP;
    case actor::FinishReason::kLength: return FINISH_REASON_LENGTH;
    case actor::FinishReason::kContext: return FINISH_REASON_CONTEXT;
    case actor::FinishReason::kAborted: return FINISH_REASON_ABORTED;
  }
  return FINISH_REASON_UNSPECIFIED;
}

}  // namespace

class RequestHandle {
 public:
  // Constant after Submit.
  uint64_t id = 0;
  GenerateRequest request;
  actor::SamplingOptions sampling;
  RolloutWorker::GroupSink on_group;
  RolloutWorker::DoneCallback on_done;
  // Serialises the callbacks of this request; `closed` once on_done ran (no
  // callback after that).
  absl::Mutex deliver_mu;
  bool closed ABSL_GUARDED_BY(deliver_mu) = false;
  // Guarded by Impl::mu.
  int64_t groups_left = 0;
  absl::Status status;
  bool cancelled = false;
  bool done = false;
  int64_t version = 0;    // weights at admission
  std::string model_id;   // model at admission
};

absl::Status RolloutWorkerOptions::Validate() const {
  if (name.empty()) return absl::InvalidArgumentError("name: must not be empty");
  if (max_queue < 0) return absl::InvalidArgumentError("max_queue: must be >= 0");
  if (max_batch <= 0) return absl::InvalidArgumentError("max_batch: must be > 0");
  if (max_prefill_tokens <= 0) return absl::InvalidArgumentError("max_prefill_tokens: must be > 0");
  if (pipeline_threads <= 0) return absl::InvalidArgumentError("pipeline_threads: must be > 0");
  if (rate_window <= absl::ZeroDuration()) return absl::InvalidArgumentError("rate_window: must be > 0");
  actor::LoadOptions lo;
  lo.dtype = dtype;
  lo.device = device;
  absl::Status s = lo.Validate();
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("dtype/device: ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<RolloutWorkerOptions::OnUpdate> ParseOnUpdate(const std::string& text) {
  if (text.empty() || text == "finish") return RolloutWorkerOptions::OnUpdate::kFinish;
  if (text == "abort") return RolloutWorkerOptions::OnUpdate::kAbort;
  if (text == "partial") return RolloutWorkerOptions::OnUpdate::kPartial;
  return absl::InvalidArgumentError(absl::StrCat("on_update: \"", text, "\" is not finish, abort or partial"));
}

struct RolloutWorker::Impl {
  struct ParamInfo {
    std::vector<int64_t> shape;
  };
  // A weight swap waiting for the fence; applied on the engine thread.
  struct Update {
    std::function<absl::Status()> apply;
    int64_t version = 0;
    std::string model_id;
    // Installed with the version when set (a checkpoint defines the shape).
    std::optional<actor::ModelConfig> config;
    std::map<std::string, ParamInfo> params;
    bool done = false;
    absl::Status status;
  };
  struct Inflight {
    std::shared_ptr<RequestHandle> req;
    int prompt = 0;
    // Per sample: (response token index, version) where a resumed sample
    // switched to newer weights (partial rollout).
    std::map<int, std::vector<std::pair<int, int64_t>>> switches;
  };

  // Constant after construction.
  const RolloutWorkerOptions options;
  const std::unique_ptr<actor::Tokenizer> tokenizer;
  const std::string tokenizer_hash;
  RewardClient* const reward;
  ReplayBufferClient* const replay;

  mutable absl::Mutex mu;
  std::deque<std::shared_ptr<RequestHandle>> pending ABSL_GUARDED_BY(mu);
  std::map<uint64_t, Inflight> inflight ABSL_GUARDED_BY(mu);  // generator request id ->
  int64_t inflight_rows ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<Update> update ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  int64_t version ABSL_GUARDED_BY(mu) = 0;
  std::string model_id ABSL_GUARDED_BY(mu);
  std::optional<actor::ModelConfig> config ABSL_GUARDED_BY(mu);
  std::map<std::string, ParamInfo> params ABSL_GUARDED_BY(mu);
  int64_t generated_tokens ABSL_GUARDED_BY(mu) = 0;
  int64_t failed_groups ABSL_GUARDED_BY(mu) = 0;
  int64_t pipeline_busy ABSL_GUARDED_BY(mu) = 0;
  std::deque<std::pair<absl::Time, int64_t>> rate ABSL_GUARDED_BY(mu);  // (time, tokens) per step
  uint64_t next_request_id ABSL_GUARDED_BY(mu) = 1;
  uint64_t next_gen_id ABSL_GUARDED_BY(mu) = 1;
  std::atomic<int> active_sequences{0};

  // Serialises weight loads (one update at a time) and guards the receiver.
  absl::Mutex load_mu;
  std::unique_ptr<WeightReceiver> receiver ABSL_GUARDED_BY(load_mu);
  std::string sync_group ABSL_GUARDED_BY(load_mu);
  // Receive buffers reused from one sync to the next.
  NamedTensors staging ABSL_GUARDED_BY(load_mu);

  // Engine thread only.
  actor::Transformer model{nullptr};
  std::unique_ptr<actor::Generator> gen;
  // Groups interrupted by an update (partial rollout), resubmitted with
  // their tokens so far once the new weights are in.
  std::vector<actor::GenerationRequest> parked;

  // Scores and stores finished groups (pipeline mode). Stopped (drained)
  // after the engine thread has ended, so Schedule never refuses.
  ThreadPool pipeline;
  std::thread engine;

  Impl(RolloutWorkerOptions o, std::unique_ptr<actor::Tokenizer> t, RewardClient* r, ReplayBufferClient* b)
      : options(std::move(o)),
        tokenizer(std::move(t)),
        tokenizer_hash(tokenizer ? tokenizer->Hash() : ""),
        reward(r),
        replay(b),
        pipeline(options.pipeline_threads, "rollout-pipe") {}

  // ---- request validation -------------------------------------------------

  absl::Status Validate(const GenerateRequest& r, actor::SamplingOptions* sampling) ABSL_SHARED_LOCKS_REQUIRED(mu) {
    if (!config) return absl::FailedPreconditionError("no weights loaded: call LoadWeights first");
    if (r.n() <= 0) return absl::InvalidArgumentError(absl::StrCat("n: must be > 0, got ", r.n()));
    if (r.n() > options.max_batch) {
      return absl::InvalidArgumentError(absl::StrCat("n: ", r.n(), " exceeds the worker's max_batch ", options.max_batch));
    }
    if (r.prompts_size() == 0) return absl::InvalidArgumentError("prompts: must not be empty");
    const SamplingParams& sp = r.sampling();
    if (sp.max_new_tokens() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.max_new_tokens: must be > 0, got ", sp.max_new_tokens()));
    }
    if (sp.temperature() < 0) return absl::InvalidArgumentError("sampling.temperature: must be > 0");
    if (sp.top_k() < 0) return absl::InvalidArgumentError("sampling.top_k: must be >= 0");
    if (sp.top_p() < 0 || sp.top_p() > 1) return absl::InvalidArgumentError("sampling.top_p: must be in [0, 1]");
    const int64_t vocab = config->vocab_size;
    for (int64_t id : sp.stop_token_ids()) {
      if (id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("sampling.stop_token_ids: ", id, " outside [0, ", vocab, ")"));
      }
    }
    std::set<std::string> ids;
    for (int i = 0; i < r.prompts_size(); ++i) {
      const Prompt& p = r.prompts(i);
      if (p.token_ids_size() == 0) {
        return absl::InvalidArgumentError(absl::StrCat("prompts[", i, "].token_ids: must not be empty"));
      }
      for (int j = 0; j < p.token_ids_size(); ++j) {
        if (p.token_ids(j) < 0 || p.token_ids(j) >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat("prompts[", i, "].token_ids[", j, "]: token ", p.token_ids(j),
                                                         " outside the vocabulary [0, ", vocab, ")"));
        }
      }
      if (p.token_ids_size() + static_cast<int64_t>(sp.max_new_tokens()) > config->max_positions) {
        return absl::InvalidArgumentError(
            absl::StrCat("sampling.max_new_tokens: prompts[", i, "] has ", p.token_ids_size(), " tokens; + ",
                         sp.max_new_tokens(), " exceeds the model's context of ", config->max_positions));
      }
      if (p.has_stream_key() && p.stream_key() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("prompts[", i, "].stream_key: must be >= 0"));
      }
      if (!ids.insert(PromptId(r, i)).second) {
        return absl::InvalidArgumentError(absl::StrCat("prompts[", i, "].prompt_id: duplicate \"", PromptId(r, i), "\""));
      }
    }
    if (r.pipeline()) {
      if (!reward) return absl::FailedPreconditionError("pipeline mode needs --reward_server=HOST:PORT");
      if (!replay) return absl::FailedPreconditionError("pipeline mode needs --replay_buffer=HOST:PORT");
    }
    if (r.min_policy_version() > version) {
      return absl::AbortedError(absl::StrCat("min_policy_version: ", r.min_policy_version(),
                                             " is newer than the loaded version ", version));
    }
    sampling->greedy = sp.greedy();
    sampling->temperature = sp.temperature() > 0 ? sp.temperature() : 1.0f;
    sampling->top_k = sp.top_k();
    sampling->top_p = sp.top_p() > 0 ? sp.top_p() : 1.0f;
    sampling->max_new_tokens = sp.max_new_tokens();
    sampling->stop_token_ids.assign(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
    sampling->seed = sp.seed();
    sampling->n = r.n();
    return sampling->Validate();
  }

  // Key of prompt i's random streams: its stream_key, else its position.
  static int64_t StreamKey(const GenerateRequest& r, int i) {
    return r.prompts(i).has_stream_key() ? r.prompts(i).stream_key() : i;
  }

  static std::string PromptId(const GenerateRequest& r, int i) {
    return r.prompts(i).prompt_id().empty() ? absl::StrCat("p", i) : r.prompts(i).prompt_id();
  }

  // ---- building trajectories ---------------------------------------------

  // `switches`: version switches of resumed samples (may be null).
  TrajectoryGroup MakeGroup(const RequestHandle& req, int prompt, const actor::GroupResult* result,
                            const std::map<int, std::vector<std::pair<int, int64_t>>>* switches = nullptr) {
    const GenerateRequest& r = req.request;
    const Prompt& p = r.prompts(prompt);
    const std::string prompt_id = PromptId(r, prompt);
    TrajectoryGroup g;
    g.set_group_id(absl::StrCat(r.experiment_id(), "/", r.step(), "/", prompt_id));
    g.set_experiment_id(r.experiment_id());
    g.set_step(r.step());
    g.set_prompt_id(prompt_id);
    const int64_t now = NowMicros();
    for (int i = 0; i < r.n(); ++i) {
      Trajectory* t = g.add_samples();
      t->set_trajectory_id(absl::StrCat(g.group_id(), "/", i));
      t->set_experiment_id(r.experiment_id());
      t->set_step(r.step());
      t->set_group_id(g.group_id());
      t->set_prompt_id(prompt_id);
      t->set_sample_index(i);
      *t->mutable_prompt_token_ids() = p.token_ids();
      t->set_policy_version(req.version);
      t->set_reference_answer(p.reference_answer());
      *t->mutable_metadata() = p.metadata();
      t->set_generated_unix_micros(now);
      Provenance* pv = t->mutable_provenance();
      pv->set_weights_version(req.version);
      pv->set_tokenizer_hash(tokenizer_hash);
      pv->set_rollout_worker(options.name);
      pv->set_model(req.model_id);
      if (result == nullptr) {
        t->set_finish_reason(FINISH_REASON_ABORTED);
        continue;
      }
      const actor::Completion& c = result->samples[i];
      if (switches != nullptr && switches->count(i)) {
        // A switch at token 0 means the newer version sampled every token.
        for (const auto& [at, v] : switches->at(i)) {
          if (at == 0) {
            t->set_policy_version(v);
            pv->set_weights_version(v);
            t->clear_version_switches();
            continue;
          }
          VersionSwitch* sw = t->add_version_switches();
          sw->set_token_index(at);
          sw->set_policy_version(v);
        }
      }
      std::vector<int> ids(c.tokens.begin(), c.tokens.end());
      for (int id : ids) {
        t->add_response_token_ids(id);
        t->add_loss_mask(1);
      }
      for (float lp : c.logprobs) t->add_behaviour_logprobs(lp);
      t->set_finish_reason(ToProto(c.finish_reason));
      if (r.decode_text() && tokenizer) t->set_response_text(tokenizer->Decode(ids, /*skip_special=*/true));
    }
    return g;
  }

  // ---- delivery ------------------------------------------------------------

  void Deliver(const std::shared_ptr<RequestHandle>& req, TrajectoryGroup group, bool stored, absl::Status status) {
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
  void FinishOne(const std::shared_ptr<RequestHandle>& req, absl::Status status) {
    absl::Status final_status;
    {
      absl::MutexLock lock(&mu);
      if (!status.ok() && req->status.ok()) req->status = status;
      if (--req->groups_left > 0 || req->done) return;
      req->done = true;
      final_status = req->cancelled ? absl::CancelledError("request cancelled") : req->status;
    }
    absl::MutexLock lock(&req->deliver_mu);
    req->closed = true;
    if (req->on_done) req->on_done(final_status);
  }

  // Ends a request that never reached the generator.
  void EndUndelivered(const std::shared_ptr<RequestHandle>& req, absl::Status status) {
    {
      absl::MutexLock lock(&mu);
      if (req->done) return;
      req->done = true;
    }
    absl::MutexLock lock(&req->deliver_mu);
    req->closed = true;
    if (req->on_done) req->on_done(status);
  }

  void RunPipeline(std::shared_ptr<RequestHandle> req, TrajectoryGroup group) {
    absl::Status s = ScoreAndStore(req->request, &group);
    if (!s.ok()) {
      RLMESH_LOG(WARNING) << "pipeline failed group=" << group.group_id() << ": " << s.message();
      absl::MutexLock lock(&mu);
      ++failed_groups;
    }
    Deliver(req, std::move(group), s.ok(), s);
    absl::MutexLock lock(&mu);
    --pipeline_busy;
  }

  absl::Status ScoreAndStore(const GenerateRequest& r, TrajectoryGroup* group) {
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
    absl::StatusOr<ScoreResponse> scored = reward->Score(sr);
    if (!scored.ok()) {
      return absl::Status(scored.status().code(), absl::StrCat("reward server: ", scored.status().message()));
    }
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
      t->mutable_provenance()->set_reward_source(scored->reward_source());
      t->set_scored_unix_micros(now);
    }
    PutGroupsRequest put;
    *put.add_groups() = *group;
    absl::StatusOr<PutGroupsResponse> stored = replay->PutGroups(put);
    if (!stored.ok()) {
      return absl::Status(stored.status().code(), absl::StrCat("replay buffer: ", stored.status().message()));
    }
    return absl::OkStatus();
  }

  // ---- engine --------------------------------------------------------------

  // Generator callback (engine thread, mu not held).
  void OnGroup(actor::GroupResult result) {
    Inflight entry;
    int64_t tokens = 0;
    for (const auto& c : result.samples) tokens += static_cast<int64_t>(c.tokens.size());
    {
      absl::MutexLock lock(&mu);
      auto it = inflight.find(result.id);
      if (it == inflight.end()) return;  // cannot happen: ids live until here
      entry = std::move(it->second);
      inflight.erase(it);
      inflight_rows -= entry.req->request.n();
      if (entry.req->request.pipeline() && !entry.req->cancelled) ++pipeline_busy;
      generated_tokens += tokens;
      rate.emplace_back(absl::Now(), tokens);
      while (absl::Now() - rate.front().first > options.rate_window) rate.pop_front();
    }
    TrajectoryGroup group = MakeGroup(*entry.req, entry.prompt, &result, &entry.switches);
    if (entry.req->request.pipeline() && !entry.req->cancelled) {
      auto req = entry.req;
      auto shared = std::make_shared<TrajectoryGroup>(std::move(group));
      const bool scheduled = pipeline.Schedule([this, req, shared] { RunPipeline(req, std::move(*shared)); });
      RLMESH_CHECK(scheduled) << "pipeline pool stopped while the engine runs";
    } else {
      Deliver(entry.req, std::move(group), false, absl::OkStatus());
    }
  }

  void Loop() {
    while (true) {
      std::vector<std::pair<uint64_t, actor::GenerationRequest>> admit;
      bool interrupt = false;
      std::shared_ptr<Update> apply;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](Impl* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
              return s->stop || s->update != nullptr || !s->pending.empty() || !s->inflight.empty();
            },
            this));
        if (stop) break;
        if (update) {
          // kAbort/kPartial: interrupt what runs now, swap, then regenerate
          // or continue it.
          interrupt = !inflight.empty() && options.on_update != RolloutWorkerOptions::OnUpdate::kFinish;
          if (inflight.empty() || interrupt) apply = update;
        } else {
          while (!pending.empty()) {
            auto& req = pending.front();
            const int64_t rows = static_cast<int64_t>(req->request.prompts_size()) * req->request.n();
            if (inflight_rows > 0 && inflight_rows + rows > options.max_batch) break;
            req->version = version;
            req->model_id = model_id;
            for (int i = 0; i < req->request.prompts_size(); ++i) {
              actor::GenerationRequest g;
              g.id = next_gen_id++;
              g.prompt.assign(req->request.prompts(i).token_ids().begin(), req->request.prompts(i).token_ids().end());
              g.sampling = req->sampling;
              g.prompt_index = StreamKey(req->request, i);
              inflight[g.id] = Inflight{req, i};
              admit.emplace_back(g.id, std::move(g));
            }
            inflight_rows += rows;
            pending.pop_front();
          }
        }
      }
      if (interrupt && gen) {
        std::vector<actor::GroupResult> partial = gen->Abort();
        absl::MutexLock lock(&mu);
        for (auto& p : partial) {
          auto it = inflight.find(p.id);
          if (it == inflight.end()) continue;
          const RequestHandle& r = *it->second.req;
          actor::GenerationRequest g;
          g.id = p.id;
          const auto& ids = r.request.prompts(it->second.prompt).token_ids();
          g.prompt.assign(ids.begin(), ids.end());
          g.sampling = r.sampling;
          g.prompt_index = StreamKey(r.request, it->second.prompt);
          g.resume = std::move(p.samples);
          if (options.on_update == RolloutWorkerOptions::OnUpdate::kAbort) {
            // Start the unfinished samples over: no sequence mixes versions.
            for (auto& c : g.resume) {
              if (c.finish_reason != actor::FinishReason::kAborted) continue;
              c.tokens.clear();
              c.logprobs.clear();
            }
          }
          parked.push_back(std::move(g));
        }
      }
      if (apply) {
        gen.reset();
        absl::Status s;
        try {
          s = apply->apply();
        } catch (const std::exception& e) {
          s = absl::InternalError(absl::StrCat("weight swap: ", e.what()));
        }
        absl::MutexLock lock(&mu);
        if (s.ok()) {
          version = apply->version;
          model_id = apply->model_id;
          if (apply->config) {
            config = apply->config;
            params = std::move(apply->params);
          }
        }
        apply->status = s;
        apply->done = true;
        update = nullptr;
        continue;
      }
      if (!gen && model) {
        actor::GeneratorOptions go;
        go.max_batch = options.max_batch;
        go.max_prefill_tokens = options.max_prefill_tokens;
        gen = std::make_unique<actor::Generator>(model, go);
      }
      if (!parked.empty() && gen) {
        // Resume interrupted groups first, on the weights now loaded.
        {
          absl::MutexLock lock(&mu);
          for (const auto& g : parked) {
            auto it = inflight.find(g.id);
            if (it == inflight.end()) continue;
            for (size_t i = 0; i < g.resume.size(); ++i) {
              if (g.resume[i].finish_reason != actor::FinishReason::kAborted) continue;
              auto& sw = it->second.switches[static_cast<int>(i)];
              const int64_t last = sw.empty() ? it->second.req->version : sw.back().second;
              if (last == version) continue;  // the swap failed: same weights
              sw.emplace_back(static_cast<int>(g.resume[i].tokens.size()), version);
            }
          }
        }
        std::vector<actor::GenerationRequest> resume = std::move(parked);
        parked.clear();
        for (auto& g : resume) {
          const uint64_t id = g.id;
          absl::Status s = gen->Submit(std::move(g));
          if (!s.ok()) FailInflight(id, s);
        }
      }
      for (auto& [id, g] : admit) {
        absl::Status s = gen->Submit(std::move(g));
        if (!s.ok()) FailInflight(id, s);
      }
      if (gen && !gen->Idle()) {
        absl::Status s = gen->Step([this](actor::GroupResult r) { OnGroup(std::move(r)); });
        active_sequences = static_cast<int>(gen->running());
        if (!s.ok()) {
          RLMESH_LOG(ERROR) << "generation step failed: " << s.message();
          FailAllInflight(s);
        }
      }
    }
    // Stopping: end everything still queued or running, and a waiting load.
    std::vector<std::shared_ptr<RequestHandle>> ends;
    {
      absl::MutexLock lock(&mu);
      if (update) {
        update->status = absl::CancelledError("rollout worker shutting down");
        update->done = true;
        update = nullptr;
      }
      for (auto& r : pending) ends.push_back(r);
      pending.clear();
      for (auto& [id, e] : inflight) ends.push_back(e.req);
      inflight.clear();
    }
    for (auto& r : ends) EndUndelivered(r, absl::CancelledError("rollout worker shutting down"));
  }

  void FailInflight(uint64_t gen_id, const absl::Status& s) {
    Inflight e;
    {
      absl::MutexLock lock(&mu);
      auto it = inflight.find(gen_id);
      if (it == inflight.end()) return;
      e = std::move(it->second);
      inflight.erase(it);
      inflight_rows -= e.req->request.n();
    }
    FinishOne(e.req, s);
  }

  void FailAllInflight(const absl::Status& s) {
    std::vector<Inflight> all;
    {
      absl::MutexLock lock(&mu);
      for (auto& [id, e] : inflight) all.push_back(std::move(e));
      inflight.clear();
      inflight_rows = 0;
    }
    gen.reset();
    parked.clear();
    for (auto& e : all) FinishOne(e.req, s);
  }

  // Posts `u` and waits until the engine applied it at the fence.
  absl::Status PostUpdate(std::shared_ptr<Update> u) {
    absl::MutexLock lock(&mu);
    if (stop) return absl::CancelledError("rollout worker shutting down");
    update = u;
    mu.Await(absl::Condition(
        +[](Update* x) { return x->done; }, u.get()));
    return u->status;
  }

  absl::Status CheckVersion(int64_t v) ABSL_SHARED_LOCKS_REQUIRED(mu) {
    if (v <= version) {
      return absl::InvalidArgumentError(absl::StrCat("version: ", v, " must exceed the loaded version ", version));
    }
    return absl::OkStatus();
  }
};

RolloutWorker::RolloutWorker(RolloutWorkerOptions options, std::unique_ptr<actor::Tokenizer> tokenizer,
                             RewardClient* reward, ReplayBufferClient* replay)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(tokenizer), reward, replay)) {
  impl_->engine = std::thread([this] { impl_->Loop(); });
}

RolloutWorker::~RolloutWorker() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stop = true;
    for (auto& r : impl_->pending) r->cancelled = true;
    for (auto& [id, e] : impl_->inflight) e.req->cancelled = true;
  }
  impl_->engine.join();
  impl_->pipeline.Stop();
}

absl::StatusOr<std::shared_ptr<RequestHandle>> RolloutWorker::Submit(const GenerateRequest& request,
                                                                      GroupSink on_group, DoneCallback on_done) {
  auto req = std::make_shared<RequestHandle>();
  absl::MutexLock lock(&impl_->mu);
  if (impl_->stop) return absl::CancelledError("rollout worker shutting down");
  RLMESH_RETURN_IF_ERROR(impl_->Validate(request, &req->sampling));
  if (static_cast<int64_t>(impl_->pending.size()) >= impl_->options.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat("rollout worker queue is full (", impl_->pending.size(),
                                                     " requests waiting, max_queue ", impl_->options.max_queue,
                                                     "); retry later"));
  }
  req->id = impl_->next_request_id++;
  req->request = request;
  req->on_group = std::move(on_group);
  req->on_done = std::move(on_done);
  req->groups_left = request.prompts_size();
  impl_->pending.push_back(req);
  return req;
}

void RolloutWorker::Cancel(const std::shared_ptr<RequestHandle>& handle) {
  if (!handle) return;
  bool was_pending = false;
  {
    absl::MutexLock lock(&impl_->mu);
    handle->cancelled = true;
    auto it = std::find(impl_->pending.begin(), impl_->pending.end(), handle);
    if (it != impl_->pending.end()) {
      impl_->pending.erase(it);
      was_pending = true;
    }
  }
  if (was_pending) impl_->EndUndelivered(handle, absl::CancelledError("request cancelled"));
}

absl::StatusOr<LoadResult> RolloutWorker::LoadCheckpoint(const std::string& path, int64_t version) {
  const absl::Time start = absl::Now();
  absl::MutexLock load_lock(&impl_->load_mu);
  int64_t v;
  {
    absl::MutexLock lock(&impl_->mu);
    v = version != 0 ? version : impl_->version + 1;
    RLMESH_RETURN_IF_ERROR(impl_->CheckVersion(v));
  }
  actor::LoadOptions lo;
  lo.dtype = impl_->options.dtype;
  lo.device = impl_->options.device;
  if (path.empty()) return absl::InvalidArgumentError("checkpoint_path: must not be empty");
  absl::StatusOr<actor::Transformer> loaded = actor::LoadHfModel(path, lo);
  if (!loaded.ok()) return loaded.status();
  actor::Transformer model = *loaded;
  int64_t bytes = 0;
  std::map<std::string, Impl::ParamInfo> params;
  for (const auto& [name, t] : model->NamedParameters()) {
    bytes += static_cast<int64_t>(t.nbytes());
    params[name].shape = t.sizes().vec();
  }
  if (impl_->tokenizer && impl_->tokenizer->vocab_size() > model->config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_path: model vocab_size ", model->config().vocab_size,
                                                   " is smaller than the tokenizer's ", impl_->tokenizer->vocab_size()));
  }
  auto u = std::make_shared<Impl::Update>();
  u->version = v;
  u->model_id = path;
  Impl* impl = impl_.get();
  u->apply = [impl, model]() -> absl::Status {
    impl->model = model;
    return absl::OkStatus();
  };
  u->config = model->config();
  u->params = std::move(params);
  RLMESH_RETURN_IF_ERROR(impl_->PostUpdate(u));
  RLMESH_LOG(INFO) << "loaded checkpoint path=" << path << " version=" << v;
  return LoadResult{v, bytes, absl::ToDoubleSeconds(absl::Now() - start)};
}

absl::Status RolloutWorker::ConfigureWeightSync(const WeightSyncSpec& spec) {
  RLMESH_ASSIGN_OR_RETURN(auto receiver, CreateWeightReceiver(spec));
  absl::MutexLock load_lock(&impl_->load_mu);
  impl_->receiver = std::move(receiver);
  impl_->sync_group = spec.group_name();
  impl_->staging.clear();
  RLMESH_LOG(INFO) << "weight sync configured backend=" << WeightSyncBackend_Name(impl_->receiver->backend())
                   << " group=" << spec.group_name() << " rank=" << spec.rank();
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> RolloutWorker::LoadFromSync(const WeightLayout& layout, int64_t version) {
  const absl::Time start = absl::Now();
  absl::MutexLock load_lock(&impl_->load_mu);
  if (!impl_->receiver) {
    return absl::FailedPreconditionError("weight sync is not configured: call ConfigureWeightSync first");
  }
  WeightLayout expected = layout;
  if (expected.version() == 0) expected.set_version(version);
  if (expected.version() <= 0) return absl::InvalidArgumentError("sync.version: must be > 0 (or set version)");
  // Receive first, whatever the state: for a collective backend the
  // publisher is sending now and must not be left hanging.
  WeightLayout received;
  NamedTensors tensors;
  if (impl_->staging.empty()) {
    RLMESH_ASSIGN_OR_RETURN(tensors, impl_->receiver->Receive(expected, &received));
  } else {
    // Reuse the previous round's buffers (warm memory: the fast path).
    RLMESH_RETURN_IF_ERROR(impl_->receiver->ReceiveInto(expected, impl_->staging, &received));
    tensors = impl_->staging;
  }
  const int64_t v = version != 0 ? version : received.version();
  int64_t bytes = 0;
  {
    absl::MutexLock lock(&impl_->mu);
    RLMESH_RETURN_IF_ERROR(impl_->CheckVersion(v));
    if (!impl_->config) {
      return absl::FailedPreconditionError("no model loaded: LoadWeights(checkpoint_path) once before a sync");
    }
    // Every parameter exactly once, with its shape: checked before the fence
    // so that a bad layout never leaves the model half-written.
    std::set<std::string> seen;
    for (const auto& [name, t] : tensors) {
      auto it = impl_->params.find(name);
      if (it == impl_->params.end()) {
        return absl::InvalidArgumentError(absl::StrCat("sync.tensors[", name, "]: not a parameter of the model"));
      }
      if (t.sizes().vec() != it->second.shape) {
        return absl::InvalidArgumentError(absl::StrCat("sync.tensors[", name, "].shape: does not match the model"));
      }
      seen.insert(name);
      bytes += static_cast<int64_t>(t.nbytes());
    }
    for (const auto& [name, info] : impl_->params) {
      if (!seen.count(name)) return absl::InvalidArgumentError(absl::StrCat("sync.tensors: missing ", name));
    }
  }
  auto u = std::make_shared<Impl::Update>();
  u->version = v;
  u->model_id = absl::StrCat("weight_sync:", impl_->sync_group.empty() ? "default" : impl_->sync_group);
  Impl* impl = impl_.get();
  impl_->staging = tensors;  // this round's tensors become the next round's buffers
  auto staged = std::make_shared<NamedTensors>(std::move(tensors));
  u->apply = [impl, staged]() -> absl::Status {
    at::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> params;
    for (auto& [name, p] : impl->model->NamedParameters()) params[name] = p;
    for (auto& [name, t] : *staged) params.at(name).copy_(t);
    return absl::OkStatus();
  };
  RLMESH_RETURN_IF_ERROR(impl_->PostUpdate(u));
  RLMESH_LOG(INFO) << "received weights version=" << v << " bytes=" << bytes;
  return LoadResult{v, bytes, absl::ToDoubleSeconds(absl::Now() - start)};
}

RolloutStatus RolloutWorker::Status() const {
  RolloutStatus s;
  absl::MutexLock lock(&impl_->mu);
  s.set_policy_version(impl_->version);
  s.set_active_sequences(impl_->active_sequences.load());
  s.set_queued_requests(static_cast<int32_t>(impl_->pending.size()));
  s.set_generated_tokens(impl_->generated_tokens);
  s.set_failed_groups(impl_->failed_groups);
  if (impl_->update) s.set_pending_update_version(impl_->update->version);
  if (!impl_->rate.empty()) {
    int64_t tokens = 0;
    for (const auto& [t, n] : impl_->rate) tokens += n;
    const double secs = std::max(1e-3, absl::ToDoubleSeconds(absl::Now() - impl_->rate.front().first));
    s.set_tokens_per_second(static_cast<double>(tokens) / secs);
  }
  return s;
}

int64_t RolloutWorker::policy_version() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->version;
}

bool RolloutWorker::WaitIdle(absl::Duration timeout) const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->mu.AwaitWithTimeout(absl::Condition(
                                        +[](Impl* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
                                          return s->pending.empty() && s->inflight.empty() && s->pipeline_busy == 0;
                                        },
                                        impl_.get()),
                                    timeout);
}

}  // namespace rlmesh::rollout
