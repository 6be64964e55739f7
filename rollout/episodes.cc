// Rollout worker: multi-turn rollouts. Each sample of a request whose
// `environment` is set is an episode of an environment server:
//
//   admission (engine)  NewEpisodeGroup reserves the group's n rows;
//   env thread          Reset; the first observation's tokens (mask 0);
//                       the turn is queued on `ready`;
//   engine thread       MakeTurn submits prompt + response so far as one
//                       generator request (n = 1); the turn stops at a stop
//                       marker, sampling.max_new_tokens (a turn end), a
//                       stop token (the model's last turn), the episode's
//                       token budget or the context; OnTurn appends its
//                       tokens (mask 1, with their behaviour log-probs);
//   env thread          Step with the turn's text and tokens; the reward is
//                       recorded; the episode ends (done, a stop token,
//                       max_turns, the budget) or the observation's tokens
//                       are appended (mask 0) and the next turn is queued.
//
// Token-in, token-out: a turn's prompt is the exact token sequence so far;
// nothing is decoded and re-encoded except the observation, which only the
// environment produces. The engine thread never waits on an environment.

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "rollout/worker_impl.h"

namespace rlmesh::rollout {

namespace {

constexpr int kDefaultMaxTurns = 4;
constexpr int kMaxTurns = 64;
constexpr int64_t kDefaultEnvTimeoutMs = 10000;

// Random-stream key of one model turn: (prompt stream, sample, turn) mixed,
// so every turn draws from its own stream whatever else is decoding.
int64_t TurnStream(int64_t prompt_stream, int sample, int turn) {
  uint64_t x = static_cast<uint64_t>(prompt_stream) * 0x9E3779B97F4A7C15ULL;
  x ^= (static_cast<uint64_t>(sample) + 1) * 0xBF58476D1CE4E5B9ULL;
  x ^= (static_cast<uint64_t>(turn) + 1) * 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return static_cast<int64_t>(x & 0x3FFFFFFFFFFFFFFFULL);
}

bool EndsWith(const std::vector<int64_t>& tokens, const std::vector<int64_t>& tail) {
  return !tail.empty() && tail.size() <= tokens.size() &&
         std::equal(tail.begin(), tail.end(), tokens.end() - static_cast<int64_t>(tail.size()));
}

}  // namespace

absl::Status RolloutWorker::Impl::ValidateEnvironment(const GenerateRequest& r, actor::SamplingOptions* sampling) {
  const EnvironmentConfig& e = r.environment();
  if (e.address().empty()) {
    if (!e.name().empty()) return absl::InvalidArgumentError("environment.name: set without environment.address");
    if (e.max_turns() != 0) return absl::InvalidArgumentError("environment.max_turns: set without environment.address");
    if (e.max_total_tokens() != 0) {
      return absl::InvalidArgumentError("environment.max_total_tokens: set without environment.address");
    }
    if (e.stop_markers_size() != 0) {
      return absl::InvalidArgumentError("environment.stop_markers: set without environment.address");
    }
    if (e.timeout_ms() != 0) return absl::InvalidArgumentError("environment.timeout_ms: set without environment.address");
    if (e.has_reward_weight()) {
      return absl::InvalidArgumentError("environment.reward_weight: set without environment.address");
    }
    return absl::OkStatus();
  }
  if (options.on_update == RolloutWorkerOptions::OnUpdate::kAbort) {
    return absl::FailedPreconditionError(
        "environment: multi-turn rollouts need a worker whose on_update is finish or partial (this one aborts and "
        "regenerates, which would replay the environment)");
  }
  if (e.max_turns() < 0 || e.max_turns() > kMaxTurns) {
    return absl::InvalidArgumentError(absl::StrCat("environment.max_turns: must be in [1, ", kMaxTurns, "], got ",
                                                   e.max_turns()));
  }
  if (e.max_total_tokens() < 0) return absl::InvalidArgumentError("environment.max_total_tokens: must be >= 0");
  if (e.timeout_ms() < 0) return absl::InvalidArgumentError("environment.timeout_ms: must be >= 0");
  if (e.has_reward_weight() && !std::isfinite(e.reward_weight())) {
    return absl::InvalidArgumentError("environment.reward_weight: must be finite");
  }
  if (e.stop_markers_size() == 0) {
    return absl::InvalidArgumentError("environment.stop_markers: need at least one (e.g. \"</calc>\")");
  }
  if (!tokenizer) return absl::FailedPreconditionError("environment: multi-turn rollouts need a tokenizer");
  sampling->stop_sequences.clear();
  for (int i = 0; i < e.stop_markers_size(); ++i) {
    std::vector<int> ids = tokenizer->Encode(e.stop_markers(i));
    if (ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("environment.stop_markers[", i, "]: \"", e.stop_markers(i),
                                                     "\" has no tokens"));
    }
    sampling->stop_sequences.emplace_back(ids.begin(), ids.end());
  }
  if (!environment && !env_clients.count(e.address())) {
    // Checked here so a bad address fails Submit, not every episode.
    auto c = RpcClient::Create(e.address());
    if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("environment.address: ", c.status().message()));
  }
  return absl::OkStatus();
}

std::shared_ptr<EpisodeGroup> RolloutWorker::Impl::NewEpisodeGroup(const std::shared_ptr<RequestHandle>& req,
                                                                   int prompt) {
  const GenerateRequest& r = req->request;
  const EnvironmentConfig& e = r.environment();
  auto g = std::make_shared<EpisodeGroup>();
  g->req = req;
  g->prompt = prompt;
  g->key = next_episode_group++;
  g->vocab_size = config->vocab_size;
  g->max_positions = config->max_positions;
  g->max_turns = e.max_turns() > 0 ? e.max_turns() : kDefaultMaxTurns;
  // Default: whatever the context leaves after the prompt.
  const int64_t context_left = config->max_positions - r.prompts(prompt).token_ids_size();
  g->max_total_tokens = e.max_total_tokens() > 0 ? std::min<int64_t>(e.max_total_tokens(), context_left) : context_left;
  g->timeout = absl::Milliseconds(e.timeout_ms() > 0 ? e.timeout_ms() : kDefaultEnvTimeoutMs);
  g->episodes.resize(static_cast<size_t>(r.n()));
  for (auto& ep : g->episodes) ep.last_version = req->version;
  g->remaining = r.n();
  episode_groups[g->key] = g;
  return g;
}

absl::StatusOr<EnvironmentClient*> RolloutWorker::Impl::EnvClient(const std::string& address) {
  if (environment) return environment;
  absl::MutexLock lock(&mu);
  auto& c = env_clients[address];
  if (!c) {
    ClientOptions co;
    co.auth_token = options.environment_auth_token;
    auto rpc = RpcClient::Create(address, co);
    if (!rpc.ok()) return rpc.status();
    c = MakeGrpcEnvironmentClient(std::move(*rpc));
  }
  return c.get();
}

void RolloutWorker::Impl::StartEpisodes(const std::shared_ptr<EpisodeGroup>& g) {
  for (int i = 0; i < static_cast<int>(g->episodes.size()); ++i) {
    const bool scheduled = env_pool.Schedule([this, g, i] {
      {
        absl::MutexLock lock(&mu);
        if (g->ended || stop) return;
      }
      const GenerateRequest& r = g->req->request;
      const Prompt& p = r.prompts(g->prompt);
      ResetRequest reset;
      EnvironmentTask* t = reset.mutable_task();
      t->set_environment(r.environment().name());
      t->set_prompt_id(PromptId(r, g->prompt));
      *t->mutable_prompt_token_ids() = p.token_ids();
      std::vector<int> ids(p.token_ids().begin(), p.token_ids().end());
      t->set_prompt_text(tokenizer->Decode(ids, /*skip_special=*/true));
      t->set_reference_answer(p.reference_answer());
      *t->mutable_metadata() = p.metadata();
      t->set_experiment_id(r.experiment_id());
      t->set_trajectory_id(absl::StrCat(r.experiment_id(), "/", r.step(), "/", PromptId(r, g->prompt), "/", i));
      t->set_seed(r.sampling().seed() ^ static_cast<uint64_t>(TurnStream(StreamKey(r, g->prompt), i, 0)));
      auto client = EnvClient(r.environment().address());
      absl::StatusOr<ResetResponse> resp = client.ok() ? (*client)->Reset(reset, g->timeout) : client.status();
      if (!resp.ok()) {
        FailEpisodes(g, resp.status());
        return;
      }
      EpisodeGroup::Episode& ep = g->episodes[static_cast<size_t>(i)];
      ep.episode_id = resp->episode_id();
      std::vector<int64_t> obs;
      if (resp->observation_token_ids_size() > 0) {
        obs.assign(resp->observation_token_ids().begin(), resp->observation_token_ids().end());
      } else if (!resp->observation().empty()) {
        std::vector<int> enc = tokenizer->Encode(resp->observation());
        obs.assign(enc.begin(), enc.end());
      }
      for (int64_t id : obs) {
        if (id < 0 || id >= g->vocab_size) {
          FailEpisodes(g, absl::InvalidArgumentError(absl::StrCat("environment Reset: observation token ", id,
                                                                  " outside the vocabulary [0, ", g->vocab_size, ")")));
          return;
        }
      }
      if (!obs.empty()) {
        Turn* turn = &ep.turns.emplace_back();
        turn->set_source(Turn::SOURCE_ENVIRONMENT);
        turn->set_token_start(0);
        turn->set_token_end(static_cast<int32_t>(obs.size()));
        ep.tokens = obs;
        ep.logprobs.assign(obs.size(), 0.0f);
        ep.mask.assign(obs.size(), 0);
      }
      ContinueOrEnd(g, i);
    });
    if (!scheduled) {
      FailEpisodes(g, absl::CancelledError("rollout worker shutting down"));
      return;
    }
  }
}

// Environment thread: queues the next model turn, or ends the episode when
// no turn fits (max_turns, the token budget, the context).
void RolloutWorker::Impl::ContinueOrEnd(const std::shared_ptr<EpisodeGroup>& g, int sample) {
  EpisodeGroup::Episode& ep = g->episodes[static_cast<size_t>(sample)];
  const int64_t prompt_len = g->req->request.prompts(g->prompt).token_ids_size();
  const int64_t used = static_cast<int64_t>(ep.tokens.size());
  if (ep.model_turns >= g->max_turns) {
    EndEpisode(g, sample);
    return;
  }
  if (used >= g->max_total_tokens) {
    ep.finish = actor::FinishReason::kLength;
    EndEpisode(g, sample);
    return;
  }
  if (prompt_len + used >= g->max_positions) {
    ep.finish = actor::FinishReason::kContext;
    EndEpisode(g, sample);
    return;
  }
  absl::MutexLock lock(&mu);
  if (g->ended || stop) return;
  ready.emplace_back(g, sample);
}

actor::GenerationRequest RolloutWorker::Impl::MakeTurn(const std::shared_ptr<EpisodeGroup>& g, int sample) {
  EpisodeGroup::Episode& ep = g->episodes[static_cast<size_t>(sample)];
  const GenerateRequest& r = g->req->request;
  const auto& prompt = r.prompts(g->prompt).token_ids();
  actor::GenerationRequest turn;
  turn.id = next_gen_id++;
  turn.prompt.assign(prompt.begin(), prompt.end());
  turn.prompt.insert(turn.prompt.end(), ep.tokens.begin(), ep.tokens.end());
  turn.sampling = g->req->sampling;
  turn.sampling.n = 1;
  const int64_t budget = g->max_total_tokens - static_cast<int64_t>(ep.tokens.size());
  turn.sampling.max_new_tokens = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(turn.sampling.max_new_tokens, budget)));
  turn.prompt_index = TurnStream(StreamKey(r, g->prompt), sample, ep.model_turns);
  if (version != ep.last_version) {
    // The weights changed since this episode's last turn (partial rollout).
    ep.switches.emplace_back(static_cast<int>(ep.tokens.size()), version);
    ep.last_version = version;
  }
  Inflight& e = inflight[turn.id];
  e.req = g->req;
  e.prompt = g->prompt;
  e.rows = 0;
  e.start_version = version;
  e.episodes = g;
  e.sample = sample;
  e.turn_prompt = turn.prompt;
  e.turn_sampling = turn.sampling;
  e.turn_stream = turn.prompt_index;
  return turn;
}

void RolloutWorker::Impl::OnTurn(Inflight entry, actor::GroupResult result) {
  const std::shared_ptr<EpisodeGroup> g = entry.episodes;
  const int sample = entry.sample;
  EpisodeGroup::Episode& ep = g->episodes[static_cast<size_t>(sample)];
  actor::Completion& c = result.samples.at(0);
  const int start = static_cast<int>(ep.tokens.size());
  // Switches inside the turn (a partial-rollout resume) are turn-relative.
  for (const auto& [at, v] : entry.switches[0]) {
    ep.switches.emplace_back(start + at, v);
    ep.last_version = v;
  }
  ep.tokens.insert(ep.tokens.end(), c.tokens.begin(), c.tokens.end());
  ep.logprobs.insert(ep.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
  ep.mask.insert(ep.mask.end(), c.tokens.size(), 1);
  Turn* turn = &ep.turns.emplace_back();
  turn->set_source(Turn::SOURCE_MODEL);
  turn->set_token_start(start);
  turn->set_token_end(static_cast<int32_t>(ep.tokens.size()));
  ++ep.model_turns;
  ep.finish = c.finish_reason;
  // A turn ends at a stop marker or at max_new_tokens (a turn end: the
  // environment answers and the episode goes on while its budget lasts).
  // It is the model's last when it sampled a stop token id (not a marker)
  // or reached the context.
  bool last = c.finish_reason == actor::FinishReason::kContext || c.finish_reason == actor::FinishReason::kAborted;
  if (c.finish_reason == actor::FinishReason::kStop) {
    bool marker = false;
    for (const auto& m : g->req->sampling.stop_sequences) marker = marker || EndsWith(c.tokens, m);
    last = !marker;
  }
  std::vector<int> ids(c.tokens.begin(), c.tokens.end());
  StepRequest step;
  step.set_episode_id(ep.episode_id);
  step.set_action_text(tokenizer->Decode(ids, /*skip_special=*/true));
  step.mutable_action_token_ids()->Add(ids.begin(), ids.end());
  step.set_turn(ep.model_turns - 1);
  const bool scheduled = env_pool.Schedule([this, g, sample, step = std::move(step), last] {
    EpisodeGroup::Episode& ep = g->episodes[static_cast<size_t>(sample)];
    {
      absl::MutexLock lock(&mu);
      if (g->ended || stop) return;
    }
    auto client = EnvClient(g->req->request.environment().address());
    absl::StatusOr<StepResponse> resp = client.ok() ? (*client)->Step(step, g->timeout) : client.status();
    if (!resp.ok()) {
      FailEpisodes(g, resp.status());
      return;
    }
    ep.env_reward += resp->reward();
    Turn& model_turn = ep.turns.back();
    model_turn.set_reward(resp->reward());
    *model_turn.mutable_info() = resp->info();
    bool cancelled;
    {
      absl::MutexLock lock(&mu);
      cancelled = g->req->cancelled;
    }
    if (resp->done() || last || cancelled || ep.model_turns >= g->max_turns) {
      EndEpisode(g, sample);
      return;
    }
    std::vector<int64_t> obs;
    if (resp->observation_token_ids_size() > 0) {
      obs.assign(resp->observation_token_ids().begin(), resp->observation_token_ids().end());
    } else {
      std::vector<int> enc = tokenizer->Encode(resp->observation());
      obs.assign(enc.begin(), enc.end());
    }
    for (int64_t id : obs) {
      if (id < 0 || id >= g->vocab_size) {
        FailEpisodes(g, absl::InvalidArgumentError(absl::StrCat("environment Step: observation token ", id,
                                                                " outside the vocabulary [0, ", g->vocab_size, ")")));
        return;
      }
    }
    if (static_cast<int64_t>(ep.tokens.size() + obs.size()) >= g->max_total_tokens) {
      // No room for the observation and a turn after it.
      ep.finish = actor::FinishReason::kLength;
      EndEpisode(g, sample);
      return;
    }
    if (!obs.empty()) {
      Turn* t = &ep.turns.emplace_back();
      t->set_source(Turn::SOURCE_ENVIRONMENT);
      t->set_token_start(static_cast<int32_t>(ep.tokens.size()));
      ep.tokens.insert(ep.tokens.end(), obs.begin(), obs.end());
      ep.logprobs.insert(ep.logprobs.end(), obs.size(), 0.0f);
      ep.mask.insert(ep.mask.end(), obs.size(), 0);
      t->set_token_end(static_cast<int32_t>(ep.tokens.size()));
      t->set_reward(resp->reward());
      *t->mutable_info() = resp->info();
    }
    ContinueOrEnd(g, sample);
  });
  if (!scheduled) FailEpisodes(g, absl::CancelledError("rollout worker shutting down"));
}

// Environment thread: closes the episode; the last one delivers the group.
void RolloutWorker::Impl::EndEpisode(const std::shared_ptr<EpisodeGroup>& g, int sample) {
  EpisodeGroup::Episode& ep = g->episodes[static_cast<size_t>(sample)];
  if (!ep.episode_id.empty()) {
    CloseRequest close;
    close.set_episode_id(ep.episode_id);
    auto client = EnvClient(g->req->request.environment().address());
    // Best effort: the server drops idle episodes anyway.
    absl::Status s = client.ok() ? (*client)->Close(close, g->timeout) : client.status();
    if (!s.ok()) RLMESH_LOG(WARNING) << "episode=" << ep.episode_id << " close failed: " << s.message();
  }
  {
    absl::MutexLock lock(&mu);
    if (g->ended || stop) return;
    if (--g->remaining > 0) return;
    g->ended = true;
    episode_groups.erase(g->key);
    inflight_rows -= g->req->request.n();
    if (g->req->request.pipeline() && !g->req->cancelled) ++pipeline_busy;
  }
  TrajectoryGroup group = MakeEpisodeGroup(*g);
  if (g->req->request.pipeline() && !g->req->cancelled) {
    auto req = g->req;
    auto shared = std::make_shared<TrajectoryGroup>(std::move(group));
    const bool scheduled = pipeline.Schedule([this, req, shared] { RunPipeline(req, std::move(*shared)); });
    RLMESH_CHECK(scheduled) << "pipeline pool stopped while environment threads run";
  } else {
    Deliver(g->req, std::move(group), false, absl::OkStatus());
  }
}

void RolloutWorker::Impl::FailEpisodes(const std::shared_ptr<EpisodeGroup>& g, const absl::Status& s) {
  {
    absl::MutexLock lock(&mu);
    if (g->ended) return;
    g->ended = true;
    episode_groups.erase(g->key);
    inflight_rows -= g->req->request.n();
  }
  RLMESH_LOG(WARNING) << "multi-turn group prompt=" << PromptId(g->req->request, g->prompt)
                      << " failed: " << s.message();
  // Close what was opened, best effort (no episode is stepped after
  // `ended`; one mid-Reset is dropped by the server's idle expiry).
  const std::string address = g->req->request.environment().address();
  std::vector<std::string> ids;
  for (const auto& ep : g->episodes) {
    if (!ep.episode_id.empty()) ids.push_back(ep.episode_id);
  }
  if (!ids.empty()) {
    (void)env_pool.Schedule([this, address, ids, timeout = g->timeout] {
      auto client = EnvClient(address);
      if (!client.ok()) return;
      for (const auto& id : ids) {
        CloseRequest close;
        close.set_episode_id(id);
        (void)(*client)->Close(close, timeout);
      }
    });
  }
  FinishOne(g->req, s);
}

TrajectoryGroup RolloutWorker::Impl::MakeEpisodeGroup(const EpisodeGroup& g) {
  actor::GroupResult result;
  std::map<int, std::vector<std::pair<int, int64_t>>> switches;
  for (size_t i = 0; i < g.episodes.size(); ++i) {
    const auto& ep = g.episodes[i];
    actor::Completion& c = result.samples.emplace_back();
    c.sample_index = static_cast<int>(i);
    c.tokens = ep.tokens;
    c.logprobs = ep.logprobs;
    c.finish_reason = ep.finish;
    if (!ep.switches.empty()) switches[static_cast<int>(i)] = ep.switches;
  }
  TrajectoryGroup group = MakeGroup(*g.req, g.prompt, &result, &switches);
  const EnvironmentConfig& e = g.req->request.environment();
  const double weight = e.has_reward_weight() ? e.reward_weight() : 1.0;
  for (size_t i = 0; i < g.episodes.size(); ++i) {
    const auto& ep = g.episodes[i];
    Trajectory* t = group.mutable_samples(static_cast<int>(i));
    t->mutable_loss_mask()->Assign(ep.mask.begin(), ep.mask.end());
    for (const Turn& turn : ep.turns) *t->add_turns() = turn;
    t->set_environment_reward(ep.env_reward);
    t->set_episode_id(ep.episode_id);
    // Without the reward server (evaluation) the environment's reward is
    // the reward; the pipeline adds the verifiers' (ScoreAndStore).
    t->set_reward(weight * ep.env_reward);
    (*t->mutable_reward_components())["environment"] = ep.env_reward;
  }
  return group;
}

}  // namespace rlmesh::rollout
