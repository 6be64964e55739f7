// Rollout worker: the engine thread (admission into the generator under
// max_batch, decoding steps, the weight-update fence with kFinish / kAbort /
// kPartial) and the update hand-off from loading threads.

#include "rollout/worker_impl.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "dist/device.h"

namespace rlmesh::rollout {

// Generator callback (engine thread, mu not held).
void RolloutWorker::Impl::CountGraphs(const actor::GenerationEngine& engine) {
  const actor::DecodeGraphStats now = engine.graph_stats();
  if (&engine != graphs_of || now.captures < graphs_seen.captures || now.replays < graphs_seen.replays) {
    graphs_of = &engine;
    graphs_seen = actor::DecodeGraphStats();
  }
  absl::MutexLock lock(&mu);
  graph_captures += now.captures - graphs_seen.captures;
  graph_replays += now.replays - graphs_seen.replays;
  graphs_seen = now;
}

void RolloutWorker::Impl::OnGroup(actor::GroupResult result) {
  Inflight entry;
  int64_t tokens = 0;
  for (const auto& c : result.samples) tokens += static_cast<int64_t>(c.tokens.size());
  {
    absl::MutexLock lock(&mu);
    auto it = inflight.find(result.id);
    if (it == inflight.end()) return;  // cannot happen: ids live until here
    entry = std::move(it->second);
    inflight.erase(it);
    inflight_rows -= entry.rows;
    if (!entry.episodes && entry.req->request.pipeline() && !entry.req->cancelled) ++pipeline_busy;
    generated_tokens += tokens;
    rate.emplace_back(absl::Now(), tokens);
    while (absl::Now() - rate.front().first > options.rate_window) rate.pop_front();
  }
  if (entry.episodes) {
    OnTurn(std::move(entry), std::move(result));
    return;
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

namespace {

// Whether the engine thread has something to do (else it sleeps in Await):
// a stop; an update it can apply now or sequences to step toward it; a
// queued request that fits; sequences decoding; model turns to submit.
bool EngineHasWork(RolloutWorker::Impl* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
  if (s->stop || !s->inflight.empty() || !s->ready.empty()) return true;
  if (s->update != nullptr) {
    // kFinish waits for running episodes too (they hold no generator row
    // while their environment answers); the others apply at once.
    return s->options.on_update != RolloutWorkerOptions::OnUpdate::kFinish || s->episode_groups.empty();
  }
  if (s->pending.empty()) return false;
  const auto& req = s->pending.front()->request;
  const int64_t rows = static_cast<int64_t>(req.prompts_size()) * req.n();
  return s->inflight_rows == 0 || s->inflight_rows + rows <= s->options.max_batch;
}

}  // namespace

// Long because: the engine thread's loop: under one lock it takes a weight update or the next
// pending requests, then outside the lock interrupts, swaps weights, resumes parked groups, admits
// and steps; the per-iteration locals carry what was decided under the lock to what runs outside
// it.
void RolloutWorker::Impl::Loop() {
  while (true) {
    std::vector<std::pair<uint64_t, actor::GenerationRequest>> admit;
    std::vector<std::shared_ptr<EpisodeGroup>> start;
    bool interrupt = false;
    bool released = false;
    std::shared_ptr<Update> apply;
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&EngineHasWork, this));
      if (stop) break;
      released = weights_released;
      if (update) {
        // kAbort/kPartial: interrupt what runs now, swap, then regenerate
        // or continue it. kFinish: wait for in-flight sequences and
        // episodes to end.
        interrupt = !inflight.empty() && options.on_update != RolloutWorkerOptions::OnUpdate::kFinish;
        const bool quiet = options.on_update == RolloutWorkerOptions::OnUpdate::kFinish
                               ? inflight.empty() && episode_groups.empty()
                               : inflight.empty();
        if (quiet || interrupt) apply = update;
      } else {
        while (!pending.empty()) {
          auto& req = pending.front();
          const int64_t rows = static_cast<int64_t>(req->request.prompts_size()) * req->request.n();
          if (inflight_rows > 0 && inflight_rows + rows > options.max_batch) break;
          req->version = version;
          req->model_id = model_id;
          const bool multi_turn = !req->request.environment().address().empty();
          for (int i = 0; i < req->request.prompts_size(); ++i) {
            if (multi_turn) {
              start.push_back(NewEpisodeGroup(req, i));
              continue;
            }
            actor::GenerationRequest g;
            g.id = next_gen_id++;
            g.prompt.assign(req->request.prompts(i).token_ids().begin(), req->request.prompts(i).token_ids().end());
            g.sampling = req->sampling;
            g.prompt_index = StreamKey(req->request, i);
            Inflight& e = inflight[g.id];
            e.req = req;
            e.prompt = i;
            e.rows = req->request.n();
            e.start_version = version;
            g.record_routing = req->request.record_routing();
            admit.emplace_back(g.id, std::move(g));
          }
          inflight_rows += rows;
          pending.pop_front();
        }
      }
      // Model turns whose environment answered (not when the weights are
      // swapped in this iteration: the next one submits them).
      if (!apply) {
        while (!ready.empty()) {
          auto [g, sample] = std::move(ready.front());
          ready.pop_front();
          if (g->ended) continue;
          actor::GenerationRequest turn = MakeTurn(g, sample);
          const uint64_t id = turn.id;
          admit.emplace_back(id, std::move(turn));
        }
      }
    }
    for (auto& g : start) StartEpisodes(g);
    if (interrupt && gen) {
      std::vector<actor::GroupResult> partial = gen->Abort();
      absl::MutexLock lock(&mu);
      for (auto& p : partial) {
        auto it = inflight.find(p.id);
        if (it == inflight.end()) continue;
        const RequestHandle& r = *it->second.req;
        actor::GenerationRequest g;
        g.id = p.id;
        if (it->second.episodes) {
          // A model turn: its prompt holds the earlier turns.
          g.prompt = it->second.turn_prompt;
          g.sampling = it->second.turn_sampling;
          g.prompt_index = it->second.turn_stream;
        } else {
          const auto& ids = r.request.prompts(it->second.prompt).token_ids();
          g.prompt.assign(ids.begin(), ids.end());
          g.sampling = r.sampling;
          g.prompt_index = StreamKey(r.request, it->second.prompt);
        }
        g.record_routing = r.request.record_routing();
        g.resume = std::move(p.samples);
        if (options.on_update == RolloutWorkerOptions::OnUpdate::kAbort) {
          // Start the unfinished samples over: no sequence mixes versions.
          for (auto& c : g.resume) {
            if (c.finish_reason != actor::FinishReason::kAborted) continue;
            c.tokens.clear();
            c.logprobs.clear();
            c.routes.clear();
          }
        }
        parked.push_back(std::move(g));
      }
    }
    if (apply) {
      // Tensor-parallel ranks are kept (idle now): a sync reloads them.
      if (options.tensor_parallel == 1) gen.reset();
      absl::Status s;
      try {
        s = apply->apply();
      } catch (const std::exception& e) {
        s = dist::ExceptionStatus(e, absl::StatusCode::kInternal, "weight swap");
      }
      absl::MutexLock lock(&mu);
      if (s.ok()) {
        version = apply->version;
        model_id = apply->model_id;
        weights_released = apply->releases_weights;
        if (apply->config) {
          config = apply->config;
          params = std::move(apply->params);
          rank_bytes = std::move(apply->rank_bytes);
        }
      }
      apply->status = s;
      apply->done = true;
      update = nullptr;
      continue;
    }
    if (!gen && model && !released) {
      actor::GeneratorOptions go;
      go.max_batch = options.max_batch;
      go.max_prefill_tokens = options.max_prefill_tokens;
      go.cuda_graphs = options.cuda_graphs;
      gen = std::make_unique<actor::Generator>(std::make_shared<actor::TransformerGeneration>(model), go);
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
            const int64_t last = sw.empty() ? it->second.start_version : sw.back().second;
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
      if (!gen) {
        // Admitted as the weights were released (Sleep): nothing to run on.
        FailInflight(id, absl::FailedPreconditionError("the worker's weights were released (Sleep); load weights"));
        continue;
      }
      absl::Status s = gen->Submit(std::move(g));
      if (!s.ok()) FailInflight(id, s);
    }
    if (gen && !gen->Idle()) {
      absl::Status s = gen->Step([this](actor::GroupResult r) { OnGroup(std::move(r)); });
      active_sequences = static_cast<int>(gen->running());
      CountGraphs(*gen);
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
    for (auto& [key, g] : episode_groups) {
      g->ended = true;
      ends.push_back(g->req);
    }
    episode_groups.clear();
    ready.clear();
  }
  for (auto& r : ends) EndUndelivered(r, absl::CancelledError("rollout worker shutting down"));
}

void RolloutWorker::Impl::FailInflight(uint64_t gen_id, const absl::Status& s) {
  Inflight e;
  {
    absl::MutexLock lock(&mu);
    auto it = inflight.find(gen_id);
    if (it == inflight.end()) return;
    e = std::move(it->second);
    inflight.erase(it);
    inflight_rows -= e.rows;
  }
  if (e.episodes) {
    FailEpisodes(e.episodes, s);
    return;
  }
  FinishOne(e.req, s);
}

void RolloutWorker::Impl::FailAllInflight(const absl::Status& s) {
  std::vector<Inflight> all;
  {
    absl::MutexLock lock(&mu);
    for (auto& [id, e] : inflight) {
      inflight_rows -= e.rows;
      all.push_back(std::move(e));
    }
    inflight.clear();
  }
  if (options.tensor_parallel == 1) {
    gen.reset();  // rebuilt over `model`
  } else if (gen) {
    gen->Abort();  // the ranks drop their rows; a broken engine keeps failing until the next load
  }
  parked.clear();
  for (auto& e : all) {
    if (e.episodes) {
      FailEpisodes(e.episodes, s);
    } else {
      FinishOne(e.req, s);
    }
  }
}

// Posts `u` and waits until the engine applied it at the fence.
absl::Status RolloutWorker::Impl::PostUpdate(std::shared_ptr<Update> u) {
  absl::MutexLock lock(&mu);
  if (stop) return absl::CancelledError("rollout worker shutting down");
  update = u;
  mu.Await(absl::Condition(
      +[](Update* x) { return x->done; }, u.get()));
  return u->status;
}

absl::Status RolloutWorker::Impl::CheckVersion(int64_t v) {
  if (v <= version) {
    return absl::InvalidArgumentError(absl::StrCat("version: ", v, " must exceed the loaded version ", version));
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::rollout
