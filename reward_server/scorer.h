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

  absl::Status Validate() const;
};

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

 private:
  struct VerifierSet {
    std::vector<std::unique_ptr<Verifier>> verifiers;
    std::vector<double> weights;
    std::string source;
  };
  RewardScorer(ScorerOptions options, const actor::Tokenizer* tokenizer)
      : options_(std::move(options)), tokenizer_(tokenizer) {}
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
};

}  // namespace rlmesh
