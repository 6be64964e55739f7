// Rollout worker: validating a GenerateRequest into sampling options, and
// turning the generator's finished groups into TrajectoryGroup messages.

#include "rollout/worker_impl.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace rlmesh::rollout {

namespace {

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

absl::Status RolloutWorker::Impl::Validate(const GenerateRequest& r, actor::SamplingOptions* sampling) {
  if (!config) return absl::FailedPreconditionError("no weights loaded: call LoadWeights first");
  if (weights_released) {
    return absl::FailedPreconditionError(
        "the worker's weights were released by Sleep(release_weights): LoadWeights (a sync or a checkpoint) "
        "brings them back");
  }
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
  RLMESH_RETURN_IF_ERROR(ValidateEnvironment(r, sampling));
  return sampling->Validate();
}

// Key of prompt i's random streams: its stream_key, else its position.
int64_t RolloutWorker::Impl::StreamKey(const GenerateRequest& r, int i) {
  return r.prompts(i).has_stream_key() ? r.prompts(i).stream_key() : i;
}

std::string RolloutWorker::Impl::PromptId(const GenerateRequest& r, int i) {
  return r.prompts(i).prompt_id().empty() ? absl::StrCat("p", i) : r.prompts(i).prompt_id();
}

// `switches`: version switches of resumed samples (may be null).
TrajectoryGroup RolloutWorker::Impl::MakeGroup(const RequestHandle& req, int prompt, const actor::GroupResult* result,
                          const std::map<int, std::vector<std::pair<int, int64_t>>>* switches) {
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
    // Empty unless the request asked (record_routing) and the model has MoE
    // layers; the layout is the generator's (Trajectory.routes).
    if (r.record_routing()) t->mutable_routes()->Add(c.routes.begin(), c.routes.end());
    t->set_finish_reason(ToProto(c.finish_reason));
    if (r.decode_text() && tokenizer) t->set_response_text(tokenizer->Decode(ids, /*skip_special=*/true));
  }
  return g;
}

}  // namespace rlmesh::rollout
