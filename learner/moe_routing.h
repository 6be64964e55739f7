#pragma once

// The learner's side of MoE routing: checking the routes a trajectory
// carries (Trajectory.routes), replaying them in the policy's forward passes
// (rl.routing_replay), the router's load-balancing loss
// (rl.router_aux_loss_coef) and how often the replayed experts differ from
// the ones the learner's own router would pick.
//
// Not thread-safe: a MoeForward belongs to the thread running the forward.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "actor/model_config.h"
#include "actor/transformer.h"
#include "learner/batching.h"
#include "proto/common.pb.h"

namespace rlmesh::learner {

// OK when `t.routes` is empty, or holds exactly (prompt + response - 1) x
// (MoE layers) x k expert ids, each in [0, num_experts) (the layout
// Trajectory.routes documents); INVALID_ARGUMENT naming `field` (e.g.
// "groups[0].samples[1]") otherwise.
absl::Status CheckRoutes(const Trajectory& t, const actor::ModelConfig& config, const std::string& field);

// One forward pass of an MoE policy over rows [begin, end) of a batch,
// narrowed to T positions: while it lives, the model replays those rows'
// routes (when `routes` is non-null) and records every MoE layer's router
// logits. Construct it right before the forward and read it after.
class MoeForward {
 public:
  // `routes`: one entry per batch row (Trajectory.routes), or null to let
  // the router choose. Not owned; must outlive the call to the model.
  // `packed`: the rows' packed layout when the forward runs over it (the
  // routes are placed where PackSeqs put each row's tokens), null for
  // padded rows. REQUIRES: the model has MoE layers; each row's routes cover
  // at most T positions; `packed` (if any) packs rows [begin, end) at
  // row_len T with no shared prefix.
  MoeForward(actor::Transformer& model, const std::vector<std::vector<int32_t>>* routes, int64_t begin,
             int64_t end, int64_t T, const PackedRows* packed = nullptr);
  ~MoeForward();
  MoeForward(const MoeForward&) = delete;
  MoeForward& operator=(const MoeForward&) = delete;

  // After the forward: actor::LoadBalancingLoss over the router logits of
  // the positions where `real` is nonzero (differentiable): [rows, T], or
  // [R * W] in the packed layout.
  at::Tensor AuxLoss(const at::Tensor& real) const;
  // After a replayed forward: (positions whose replayed experts differ, as a
  // set, from the learner router's top-k at some MoE layer; positions
  // replayed). (0, 0) without replay.
  std::pair<int64_t, int64_t> Mismatch() const;

 private:
  actor::Transformer& model_;
  const actor::ModelConfig config_;
  actor::MoeRouting routing_;
};

}  // namespace rlmesh::learner
