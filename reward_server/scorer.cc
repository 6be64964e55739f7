#include "reward_server/scorer.h"

#include <cmath>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/path_root.h"
#include "common/status_macros.h"

namespace rlmesh {
namespace {

// Result slot shared with a verifier pool task that may outlive the wait.
struct Pending {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<double> result ABSL_GUARDED_BY(mu) = absl::UnknownError("not run");
};

}  // namespace

absl::Status ScorerOptions::Validate() const {
  if (verifier_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("verifier_timeout: must be > 0");
  if (max_items <= 0) return absl::InvalidArgumentError("max_items: must be > 0");
  if (reward_model_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("reward_model_timeout: must be > 0");
  }
  if (!std::isfinite(reward_model_weight)) return absl::InvalidArgumentError("reward_model_weight: must be finite");
  if (verifier_threads <= 0) return absl::InvalidArgumentError("verifier_threads: must be > 0");
  if (verifier_queue < 0) return absl::InvalidArgumentError("verifier_queue: must be >= 0");
  return absl::OkStatus();
}

RewardScorer::RewardScorer(ScorerOptions options, const actor::Tokenizer* tokenizer)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      verifier_pool_(options_.verifier_threads, "rs-verify", options_.verifier_queue) {}

absl::StatusOr<std::unique_ptr<RewardScorer>> RewardScorer::Create(ScorerOptions options,
                                                                   const actor::Tokenizer* tokenizer) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  if (options.default_verifiers.empty() && options.reward_model == nullptr) {
    VerifierConfig numeric;
    numeric.set_name("numeric_answer");
    options.default_verifiers.push_back(numeric);
  }
  std::unique_ptr<RewardScorer> scorer(new RewardScorer(std::move(options), tokenizer));
  for (const std::string& program : scorer->options_.allowed_commands) {
    if (program.empty()) return absl::InvalidArgumentError("allowed_commands: an empty program name");
    scorer->allowed_programs_.insert(ResolvePath(program));
  }
  for (const VerifierConfig& v : scorer->options_.default_verifiers) {
    if (v.name() == "command" && !v.command().empty()) scorer->allowed_programs_.insert(ResolvePath(v.command(0)));
  }
  google::protobuf::RepeatedPtrField<VerifierConfig> defaults(scorer->options_.default_verifiers.begin(),
                                                               scorer->options_.default_verifiers.end());
  RLMESH_RETURN_IF_ERROR(scorer->Verifiers(defaults, /*from_request=*/false).status());
  return scorer;
}

absl::StatusOr<std::shared_ptr<const RewardScorer::VerifierSet>> RewardScorer::Verifiers(
    const google::protobuf::RepeatedPtrField<VerifierConfig>& configs, bool from_request) {
  for (int i = 0; from_request && i < configs.size(); ++i) {
    if (configs[i].name() != "command" || configs[i].command().empty()) continue;
    if (allowed_programs_.count(ResolvePath(configs[i].command(0))) == 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          "verifiers[", i, "].command: '", configs[i].command(0),
          "' is not a program this reward server may run; start it with --allowed_commands naming it (or, "
          "for `coordinator launch`, give the coordinator --allowed_commands)"));
    }
  }
  std::string key;
  for (const auto& c : configs) key += c.SerializeAsString() + '\0';
  absl::MutexLock lock(&mu_);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  auto set = std::make_shared<VerifierSet>();
  std::vector<std::string> names;
  for (int i = 0; i < configs.size(); ++i) {
    RLMESH_ASSIGN_OR_RETURN(auto v, MakeVerifier(configs[i], absl::StrCat("verifiers[", i, "]")));
    names.push_back(v->label());
    set->verifiers.push_back(std::move(v));
    set->weights.push_back(configs[i].weight() != 0 ? configs[i].weight() : 1.0);
  }
  set->source = absl::StrCat("verifiers:", absl::StrJoin(names, "+"));
  if (cache_.size() > 64) cache_.clear();
  cache_[key] = set;
  return std::shared_ptr<const VerifierSet>(set);
}

// Long because: one request end to end (pick the verifiers, decode and validate every item, queue the
// blocking verifier calls on the pool under one deadline, run the reward model meanwhile, wait, combine);
// the pool's calls and the combination share the per-request state declared along the way.
absl::StatusOr<ScoreResponse> RewardScorer::Score(const ScoreRequest& request, absl::Time rpc_deadline) {
  if (request.items_size() > options_.max_items) {
    return absl::InvalidArgumentError(
        absl::StrCat("items: ", request.items_size(), " items exceed the limit of ", options_.max_items));
  }
  std::shared_ptr<const VerifierSet> set;
  if (request.verifiers_size() > 0) {
    RLMESH_ASSIGN_OR_RETURN(set, Verifiers(request.verifiers(), /*from_request=*/true));
  } else {
    google::protobuf::RepeatedPtrField<VerifierConfig> defaults(options_.default_verifiers.begin(),
                                                                 options_.default_verifiers.end());
    RLMESH_ASSIGN_OR_RETURN(set, Verifiers(defaults, /*from_request=*/false));
  }
  if (request.verifier_timeout_ms() < 0) return absl::InvalidArgumentError("verifier_timeout_ms: must be >= 0");
  const absl::Duration timeout = request.verifier_timeout_ms() > 0
                                     ? absl::Milliseconds(request.verifier_timeout_ms())
                                     : options_.verifier_timeout;

  // Decode and validate everything before running any verifier.
  const int n = request.items_size();
  std::vector<VerifierInput> inputs(n);
  for (int i = 0; i < n; ++i) {
    const ScoreItem& item = request.items(i);
    VerifierInput& in = inputs[i];
    for (int id : item.completion_token_ids()) {
      if (id < 0 || (tokenizer_ != nullptr && id >= tokenizer_->vocab_size())) {
        return absl::InvalidArgumentError(absl::StrCat("items[", i, "].completion_token_ids: id ", id, " out of range"));
      }
    }
    auto decode = [&](const std::string& text, const auto& ids, const char* field) -> absl::StatusOr<std::string> {
      if (!text.empty() || ids.empty()) return text;
      if (tokenizer_ == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("items[", i, "].", field, ": empty and this server has no tokenizer to decode ids"));
      }
      return tokenizer_->Decode(std::vector<int>(ids.begin(), ids.end()), /*skip_special=*/true);
    };
    RLMESH_ASSIGN_OR_RETURN(in.completion, decode(item.completion_text(), item.completion_token_ids(), "completion_text"));
    RLMESH_ASSIGN_OR_RETURN(in.prompt, decode(item.prompt_text(), item.prompt_token_ids(), "prompt_text"));
    in.reference_answer = item.reference_answer();
    in.completion_tokens = item.completion_token_ids_size();
    in.max_new_tokens = item.max_new_tokens();
  }

  // Blocking verifiers run on the verifier pool, all of a request's calls
  // queued at once under one deadline. A call still running at the deadline
  // is counted as timed out; its worker finishes it and moves on.
  const size_t nv = set->verifiers.size();
  int64_t blocking_calls = 0;
  for (const auto& verifier : set->verifiers) blocking_calls += verifier->may_block() ? n : 0;
  if (blocking_calls > int64_t{options_.verifier_threads} + options_.verifier_queue) {
    return absl::InvalidArgumentError(absl::StrCat(
        "items: ", n, " items need ", blocking_calls, " blocking verifier calls, more than this server holds (",
        options_.verifier_threads, " verifier_threads + ", options_.verifier_queue,
        " verifier_queue); send fewer items or raise --verifier_queue"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  // Set when this call stops waiting early: its queued calls are skipped.
  auto abandoned = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::vector<absl::StatusOr<double>>> scores(n, std::vector<absl::StatusOr<double>>(nv, 0.0));
  std::vector<std::pair<std::pair<int, size_t>, std::shared_ptr<Pending>>> pending;
  for (int i = 0; i < n; ++i) {
    for (size_t v = 0; v < nv; ++v) {
      const Verifier* verifier = set->verifiers[v].get();
      if (!verifier->may_block()) {
        scores[i][v] = verifier->Score(inputs[i], deadline);
        continue;
      }
      auto p = std::make_shared<Pending>();
      // The set and input are copied into the task, so one still running
      // after this call has returned never touches freed memory.
      absl::Status queued = verifier_pool_.TrySchedule([p, set, v, in = inputs[i], deadline, abandoned] {
        absl::StatusOr<double> r = absl::DeadlineExceededError("verifier exceeded its deadline");
        // A call that waited past its deadline (or whose request gave up)
        // would only be discarded: skip it and free the thread.
        if (!abandoned->load() && absl::Now() < deadline) r = set->verifiers[v]->Score(in, deadline);
        absl::MutexLock l(&p->mu);
        p->result = std::move(r);
        p->done = true;
      });
      if (!queued.ok()) {
        abandoned->store(true);
        if (queued.code() != absl::StatusCode::kResourceExhausted) return queued;
        return absl::ResourceExhaustedError(
            absl::StrCat("reward server busy: all ", options_.verifier_threads, " verifier_threads busy and ",
                         options_.verifier_queue, " blocking verifier calls queued (verifier_queue); retry later"));
      }
      pending.push_back({{i, v}, p});
    }
  }
  // The reward model runs (batched with other callers) while the blocking
  // verifiers run on the pool.
  std::vector<double> rm_scores;
  if (options_.reward_model != nullptr) {
    std::vector<RewardModelItem> rm_items(n);
    for (int i = 0; i < n; ++i) {
      const ScoreItem& item = request.items(i);
      auto ids = [&](const auto& token_ids, const std::string& text) {
        if (token_ids.empty() && !text.empty() && tokenizer_ != nullptr) return tokenizer_->Encode(text);
        return std::vector<int>(token_ids.begin(), token_ids.end());
      };
      rm_items[i].prompt_ids = ids(item.prompt_token_ids(), item.prompt_text());
      rm_items[i].completion_ids = ids(item.completion_token_ids(), item.completion_text());
    }
    auto scored = options_.reward_model->Score(
        rm_items, std::min(rpc_deadline, absl::Now() + options_.reward_model_timeout));
    if (!scored.ok()) {
      // Calls still queued are skipped; running ones hold their own state.
      abandoned->store(true);
      return scored.status();
    }
    rm_scores = *std::move(scored);
  }
  for (auto& [where, p] : pending) {
    absl::MutexLock l(&p->mu);
    p->mu.AwaitWithDeadline(absl::Condition(&p->done), deadline + absl::Milliseconds(50));
    scores[where.first][where.second] =
        p->done ? p->result : absl::DeadlineExceededError("verifier exceeded its deadline");
  }

  ScoreResponse response;
  response.set_reward_source(options_.reward_model == nullptr ? set->source
                                                                : nv == 0 ? "reward_model"
                                                                          : set->source + "+reward_model");
  for (int i = 0; i < n; ++i) {
    ScoreResult* r = response.add_results();
    r->set_item_id(request.items(i).item_id());
    r->set_completion_text(inputs[i].completion);
    double total = 0;
    for (size_t v = 0; v < nv; ++v) {
      const std::string& label = set->verifiers[v]->label();
      const auto& s = scores[i][v];
      if (s.ok()) {
        (*r->mutable_components())[label] = *s;
        total += set->weights[v] * *s;
      } else if (s.status().code() == absl::StatusCode::kDeadlineExceeded) {
        (*r->mutable_components())[label] = 0;
        r->add_timed_out(label);
        timeouts_.fetch_add(1);
      } else if (s.status().code() == absl::StatusCode::kInvalidArgument) {
        return absl::InvalidArgumentError(absl::StrCat("items[", i, "].", s.status().message()));
      } else {
        return absl::InternalError(absl::StrCat("items[", i, "]: ", s.status().message()));
      }
    }
    if (options_.reward_model != nullptr) {
      (*r->mutable_components())["reward_model"] = rm_scores[i];
      total += options_.reward_model_weight * rm_scores[i];
    }
    r->set_reward(total);
  }
  scored_.fetch_add(n);
  return response;
}

RewardStatus RewardScorer::GetStatus() const {
  RewardStatus s;
  s.set_scored_items(scored_.load());
  s.set_verifier_timeouts(timeouts_.load());
  if (options_.reward_model != nullptr) s.set_reward_model_timeouts(options_.reward_model->stats().timeouts);
  if (options_.reward_model != nullptr) {
    const RewardModelStats rm = options_.reward_model->stats();
    s.set_cache_hits(rm.cache_hits);
    s.set_mean_batch_size(rm.mean_batch_size());
  }
  return s;
}

}  // namespace rlmesh
