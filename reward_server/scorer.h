#pragma once

// The reward server's core, no gRPC: decodes completions, runs the
// configured verifiers (each bounded by a deadline) and the reward model
// when there is one, and sums them with their weights.

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "actor/tokenizer.h"
#include "common/thread_pool.h"
#include "proto/config.pb.h"
#include "proto/reward.pb.h"
#include "reward_server/reward_model.h"
#include "reward_server/verifiers.h"

namespace rlmesh {

struct ScorerOptions {
  // Verifiers used when a request names none. Default: numeric_answer.
  std::vector<VerifierConfig> default_verifiers;
  // Deadline of one verifier call when a request gives none. Default 1 s.
  absl::Duration verifier_timeout = absl::Seconds(1);
  // Largest batch accepted. Default 4096 items.
  int max_items = 4096;
  // Reward model scored on every item as component "reward_model"; null =
  // none. Not owned; must outlive the scorer. With a model and no
  // default_verifiers, the model alone scores requests that name no
  // verifiers. Default null.
  RewardModel* reward_model = nullptr;
  // Weight of the reward model's score in the sum. Default 1.
  double reward_model_weight = 1.0;
  // Longest a request waits for the reward model (the call's own deadline
  // applies when sooner); then the request fails with DEADLINE_EXCEEDED
  // (the caller retries) rather than scoring it without the model.
  // Default 60 s.
  absl::Duration reward_model_timeout = absl::Seconds(60);
  // Programs a request may name in a `command` verifier (its command[0]),
  // compared after resolving symlinks and relative parts. The programs of
  // default_verifiers are always allowed: whoever started the server chose
  // them. Any other program a request names is refused with
  // PERMISSION_DENIED, so a caller cannot make the server run a program of
  // its choosing. Default empty (only the defaults' programs).
  std::vector<std::string> allowed_commands;
  // Threads running blocking verifiers (`command`, `format`): at most this
  // many such calls run at once across all requests. Default 64.
  int verifier_threads = 64;
  // Blocking verifier calls (one per item and blocking verifier) that may
  // wait for a verifier thread. A request whose calls do not all fit fails
  // RESOURCE_EXHAUSTED; one that needs more than verifier_threads +
  // verifier_queue calls could never fit and fails INVALID_ARGUMENT.
  // Default 8192.
  int verifier_queue = 8192;

  absl::Status Validate() const;
};

// Blocking verifiers run on a pool of options.verifier_threads threads. A
// call that misses its deadline is reported as timed out; its thread
// finishes it (each verifier honours the deadline itself) and moves on, and
// a call whose deadline passed while it waited is skipped. When every
// thread is busy and verifier_queue calls wait, further requests are
// refused RESOURCE_EXHAUSTED: the pool never grows. The destructor runs or
// skips what is queued and joins the threads.
//
// Safe for concurrent use.
class RewardScorer {
 public:
  // `tokenizer` decodes token ids when a request carries no text; may be
  // null (then text is required). Not owned.
  static absl::StatusOr<std::unique_ptr<RewardScorer>> Create(ScorerOptions options,
                                                              const actor::Tokenizer* tokenizer);

  // `deadline`: the caller's (RPC) deadline; bounds the reward model's wait.
  absl::StatusOr<ScoreResponse> Score(const ScoreRequest& request, absl::Time deadline = absl::InfiniteFuture());
  RewardStatus GetStatus() const;
  // Blocking verifier calls accepted and not yet finished, running or
  // queued (at most verifier_threads + verifier_queue).
  int blocking_calls_held() const { return verifier_pool_.unfinished(); }

 private:
  struct VerifierSet {
    std::vector<std::unique_ptr<Verifier>> verifiers;
    std::vector<double> weights;
    std::string source;
  };
  RewardScorer(ScorerOptions options, const actor::Tokenizer* tokenizer);
  // `from_request`: the configs came in a Score request, so their
  // `command` programs must be allowed ones.
  absl::StatusOr<std::shared_ptr<const VerifierSet>> Verifiers(
      const google::protobuf::RepeatedPtrField<VerifierConfig>& configs, bool from_request);

  const ScorerOptions options_;
  const actor::Tokenizer* const tokenizer_;
  // Resolved programs requests may run: allowed_commands and the defaults'.
  std::set<std::string> allowed_programs_;
  absl::Mutex mu_;
  // Compiled verifier sets by serialized config.
  std::map<std::string, std::shared_ptr<const VerifierSet>> cache_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> scored_{0};
  std::atomic<int64_t> timeouts_{0};
  // Runs blocking verifier calls. Its tasks hold their own state (the
  // verifier set, a copy of the input, the result slot), never `this`; last
  // so that it is joined before the members above go.
  ThreadPool verifier_pool_;
};

}  // namespace rlmesh
