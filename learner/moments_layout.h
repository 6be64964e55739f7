#pragma once

// AdamW moments in a checkpoint, read back whatever layout wrote them.
//
// A checkpoint's moments take one of three forms (learner/trainer_checkpoint.cc):
//   - `optimizer.safetensors`: plain DP's flat layout, every parameter's
//     elements in NamedParameters() order (plain DP, ZeRO-3 and TP without
//     ZeRO-1 gather into it);
//   - `optimizer-rank-<r>.safetensors`, one per rank (ZeRO-1): rank r holds
//     its ZeRO-1 share of the flat layout of its tensor-parallel slices.
//     With tp = T and world size W, rank r is TP rank r % T of replica
//     r / T; the W / T replicas holding TP slice t cut that slice's flat
//     layout (zero-padded to a multiple of W / T) into equal shares, in
//     replica order. T = 1 is plain ZeRO-1;
//   - `optimizer-rank-<r>.safetensors` under expert parallelism (W / ep
//     groups of ep ranks, no ZeRO, no TP): rank r's parameters, the
//     replicated ones and then its experts [k E/ep, (k+1) E/ep) of every
//     MoE layer (k = r % ep), each in NamedParameters() order
//     (learner/expert_parallel.h).
// ReadWholeMoments turns any of them back into plain DP's flat layout, so
// that a checkpoint resumes under any layout (DeepSpeed calls this a
// universal checkpoint). It reads every rank's file: the caller holds the
// whole model's moments for a moment.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace rlmesh::learner {

// How a checkpoint's moments were written (TrainerState's fields).
struct MomentsLayout {
  int world_size = 1;
  int tp = 1;
  bool zero1 = false;
  int ep = 1;
};

// The parameters of the flat layout: Hugging Face names and whole shapes, in
// NamedParameters() order.
using ParameterShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// `<prefix>.exp_avg` and `<prefix>.exp_avg_sq` ("policy", "critic") of the
// checkpoint folder `dir`, written under `layout`, as two flat fp32 tensors
// over `shapes`. INVALID_ARGUMENT naming the file when a share's size or a
// tensor is not what the layout and shapes imply (another model, a damaged
// file), or when the layout is impossible (tp not dividing world_size, a
// parameter's split dimension not divisible by tp).
absl::StatusOr<std::pair<at::Tensor, at::Tensor>> ReadWholeMoments(const std::string& dir,
                                                                   const MomentsLayout& layout,
                                                                   const std::string& prefix,
                                                                   const ParameterShapes& shapes);

// A whole-layout checkpoint's moments (`optimizer.safetensors`: plain DP,
// ZeRO-3 and TP without ZeRO-1 write it) read a range at a time, for a rank
// that keeps only its share of them (a ZeRO-3 rank: 1/dp), so that nothing
// whole is read: `read(k, begin, count)` gives elements [begin, begin +
// count) of exp_avg (k = 0) or exp_avg_sq (k = 1) of `<prefix>` in plain
// DP's flat layout over `shapes`, fp32. FAILED_PRECONDITION for a layout
// with per-rank files (ZeRO-1, EP: use ReadWholeMoments); INVALID_ARGUMENT
// naming the file when a tensor is not the layout's size or fp32.
using MomentsRangeReader = std::function<absl::StatusOr<at::Tensor>(int k, int64_t begin, int64_t count)>;
absl::StatusOr<MomentsRangeReader> OpenMomentsRanges(const std::string& dir, const MomentsLayout& layout,
                                                     const std::string& prefix, const ParameterShapes& shapes);

}  // namespace rlmesh::learner
