#pragma once

// Generation with the policy split over `tp` tensor-parallel ranks
// (parallel/tensor_parallel.h: column/row/vocabulary-parallel slices, each
// rank caching only its own key/value heads), driven as one engine.
//
// The ranks run in lockstep, one thread each: every call (Submit, Step,
// Abort, Load) is run by every rank on the same input, and each rank keeps
// its own actor::Generator. Their schedulers stay identical without
// exchanging any decision: a rank samples from the logits all-gathered over
// the group (the same bits on every rank), and every random stream is keyed
// by (seed, prompt, sample), so admission, sampled tokens, finishes and
// cache moves agree. Rank 0's results are what the caller gets. (SGLang
// feeds its tensor-parallel schedulers the same requests in the same way.)
//
// Each rank copies only its slice of the weights it is given (Load), so the
// model's memory is split; the full weights pass through the caller once
// (a checkpoint read). A weight sync in pieces hands each rank its own
// slice (LoadSlices), and nothing whole is assembled.
//
// Thread-safety: not thread-safe; one caller thread (the rollout worker's
// engine thread), which also runs rank 0. A failed collective fails the
// call and leaves the engine broken (every later call returns that error):
// create a new one.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/generate.h"
#include "actor/model_config.h"

namespace rlmesh::rollout {

struct TensorParallelEngineOptions {
  // Ranks (threads), each holding 1/tp of the model; >= 1. Default 2.
  int tp = 2;
  // Timeout of the ranks' collectives, milliseconds. Default 300000.
  int64_t timeout_ms = 300'000;
  // Every rank's Generator runs with these.
  actor::GeneratorOptions generator;

  absl::Status Validate() const;
};

class TensorParallelEngine final : public actor::GenerationEngine {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;

  // Starts the ranks, forms their group (Gloo, CPU) and creates each rank's
  // slice of a model shaped `config`. INVALID_ARGUMENT / UNIMPLEMENTED
  // naming what cannot be split (parallel::ValidateTensorParallel); ABORTED
  // when the group cannot form. Weights are unset until Load.
  static absl::StatusOr<std::unique_ptr<TensorParallelEngine>> Create(const actor::ModelConfig& config,
                                                                      const TensorParallelEngineOptions& options);
  ~TensorParallelEngine();
  TensorParallelEngine(const TensorParallelEngine&) = delete;
  TensorParallelEngine& operator=(const TensorParallelEngine&) = delete;

  // Every rank copies its slice of `full` (Hugging Face names and shapes,
  // e.g. actor::TransformerImpl::NamedParameters()). REQUIRES: Idle()
  // (FAILED_PRECONDITION). INVALID_ARGUMENT naming a missing or misshapen
  // parameter.
  absl::Status Load(const Named& full);
  // Every rank r copies slices[r], its own slice already cut (the shapes of
  // its TensorParallelModel::NamedParameters(), e.g. joined from weight-sync
  // pieces). REQUIRES: Idle() and slices.size() == tp() (FAILED_PRECONDITION
  // / INVALID_ARGUMENT).
  absl::Status LoadSlices(const std::vector<Named>& slices);

  // actor::Generator's calls, on every rank. Submit's INVALID_ARGUMENT
  // comes from rank 0 before any other rank sees the request.
  absl::Status Submit(actor::GenerationRequest request) override;
  absl::Status Step(const actor::GroupCallback& on_group) override;
  // Every rank drops its queue and rows (no collective).
  std::vector<actor::GroupResult> Abort() override;
  bool Idle() const override;
  int64_t running() const override;

  // OK, or the failure that left the engine unusable.
  const absl::Status& broken() const { return broken_; }

  int tp() const { return static_cast<int>(ranks_.size()); }
  // Bytes of rank r's parameters (its slice), for memory accounting.
  int64_t ParameterBytes(int rank) const;

  struct Rank;

 private:
  TensorParallelEngine() = default;
  // Runs job(rank) on every rank: rank 0 on the caller's thread, the others
  // on theirs; returns the first error, or OK.
  absl::Status RunOnAll(const std::function<absl::Status(Rank&)>& job);

  std::vector<std::unique_ptr<Rank>> ranks_;
  absl::Status broken_;
};

}  // namespace rlmesh::rollout
