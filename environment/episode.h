#pragma once

// The built-in environments without gRPC: an Episode answers the model's
// turns of one rollout sample; MakeEpisode builds one by environment name.
// The service (service.h) keeps them in an EpisodeTable keyed by episode id.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "environment/sandbox.h"
#include "proto/environment.pb.h"

namespace rlmesh::environment {

// One episode. Not thread-safe: the table serialises calls on one episode.
class Episode {
 public:
  virtual ~Episode() = default;
  // The observation shown before the model's first turn (may be empty).
  virtual std::string FirstObservation() = 0;
  // Answers one model turn. Errors only for a broken server (the model's
  // mistakes are observations).
  virtual absl::StatusOr<StepResponse> Step(const StepRequest& request) = 0;
};

struct EnvironmentOptions {
  // Absolute path of the calculator's evaluator binary (calc_eval).
  std::string evaluator_path;
  // Limits of each evaluator run.
  SandboxLimits sandbox;
  // Environment of a task that names none. Default "calculator".
  std::string default_environment = "calculator";

  absl::Status Validate() const;
};

// Names MakeEpisode knows: "calculator", "arithmetic".
//
// calculator: the model may write <calc>EXPR</calc> (its turn should stop at
//   the marker "</calc>"); EXPR is evaluated by the sandboxed evaluator and
//   the observation is "<result>VALUE</result>" or "<error>WHY</error>"
//   (reward 0, not done). A turn with no tool call is the final answer:
//   done, reward 1 when its last number equals the task's reference answer
//   (numerically, within 1e-6), else 0.
// arithmetic: a multi-step task of `steps` (metadata "steps", default 3, in
//   [1, 16]) sums of two numbers below 10^digits (metadata "digits", default
//   2, in [1, 6]) drawn from the task's seed and trajectory id. The first
//   observation is "Q1: A+B=". Each turn is judged by its last integer:
//   reward 1/steps when right; the observation is " correct\nQ2: C+D=" or
//   " wrong (X)\nQ2: ..."; done after the last question.
// INVALID_ARGUMENT names an unknown environment or a bad metadata value.
// `options` is not copied: it must outlive the episode.
absl::StatusOr<std::unique_ptr<Episode>> MakeEpisode(const EnvironmentTask& task, const EnvironmentOptions& options);

// The last number in `text` ("-12", "3.5"), if any. Exposed for tests.
bool LastNumber(const std::string& text, double* value);

}  // namespace rlmesh::environment
