#pragma once

// The order in which each stage of a pipeline runs a mini-batch's forward
// and backward passes (no LibTorch): the schedule learner/pipeline_parallel
// executes, a simulation of it that tests and the memory plan use, and the
// bubble the simulation predicts.
//
// With one model chunk per stage the schedule is 1F1B (PipeDream-Flush,
// Megatron's default): stage s of P first runs min(P - 1 - s, M) forwards,
// then alternates one forward and one backward, then drains the backwards.
//
// With V > 1 chunks per stage it is Megatron's interleaved schedule: the
// model is cut into P x V chunks, chunk c on stage c % P (so stage s holds
// chunks s, s + P, ...), and each stage works through its chunks in groups
// of P micro-batches: the forwards of micro-batches 0..P-1 through its
// first chunk, then through its second, ..., then micro-batches P..2P-1;
// the backwards the same way from its last chunk down. Stage s first runs
// 2 (P - 1 - s) + (V - 1) P forwards (all of them when M = P), then one
// forward and one backward alternately. A micro-batch's trip through the
// stages is V times longer in hops, each hop 1/V of the work, so the idle
// fill and drain shrink by V: the bubble is (P - 1) / (V M + P - 1) of a
// stage's time against 1F1B's (P - 1) / (M + P - 1), for up to V times the
// activations in flight on the first stage. When M is not a multiple of P,
// each stage runs the order of the next multiple without the passes of the
// micro-batches past M (the bubble then lies between the two).

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace rlmesh::parallel {

// One step of a stage's schedule: the forward or backward pass of
// micro-batch `micro` through the stage's model chunk `chunk` (0..V-1;
// the model's chunk chunk x P + stage).
struct PipelineOp {
  bool forward = true;
  int64_t micro = 0;
  int chunk = 0;
  bool operator==(const PipelineOp& o) const {
    return forward == o.forward && micro == o.micro && chunk == o.chunk;
  }
};

// Stage `stage`'s schedule over `micro_batches` micro-batches with `chunks`
// model chunks per stage (1 = 1F1B). INVALID_ARGUMENT naming learner.pp,
// learner.pp_virtual_stages or learner.pp_microbatches when a count is out
// of range (stages >= 1, chunks >= 1 and > 1 only with stages > 1,
// micro_batches >= 1, 0 <= stage < stages).
absl::StatusOr<std::vector<PipelineOp>> PipelineSchedule(int stages, int stage, int chunks, int64_t micro_batches);

// What the simulation of all stages' schedules found.
struct PipelineSimulation {
  // When the last pass ends, each chunk's forward taking `forward` time
  // units and its backward `backward`, transfers free.
  double makespan = 0;
  // The idle share of a stage's time: 1 - (its passes' time) / makespan.
  double bubble = 0;
  // Per stage: the most (micro-batch, chunk) activations it holds at once
  // (forwards run whose backward has not).
  std::vector<int64_t> max_in_flight;
  // Per stage: the most decoder layers' activations it holds at once, each
  // held chunk counting its layers (`chunk_layers`; empty: 1 each).
  std::vector<int64_t> max_layers_in_flight;
};

// Runs every stage's PipelineSchedule as the pipeline does: a stage runs
// its passes in order; a forward waits for the previous chunk's forward of
// the same micro-batch (on the stage before, the last stage's on the
// first), a backward for the next chunk's backward. `chunk_layers`: the
// layers of each of the model's stages x chunks chunks, in model order
// (empty: 1 each). FAILED_PRECONDITION when the schedules would deadlock;
// INVALID_ARGUMENT when chunk_layers has the wrong size; the errors of
// PipelineSchedule otherwise.
absl::StatusOr<PipelineSimulation> SimulatePipeline(int stages, int chunks, int64_t micro_batches,
                                                    double forward = 1.0, double backward = 2.0,
                                                    const std::vector<int64_t>& chunk_layers = {});

// The bubble an ideal schedule of this shape has with equal stages:
// (P - 1) / (V M + P - 1).
double TheoreticalBubble(int stages, int chunks, int64_t micro_batches);

}  // namespace rlmesh::parallel
