#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rlmesh::parallel {

namespace {

absl::Status CheckShape(int stages, int chunks, int64_t micro_batches) {
  if (stages < 1) return absl::InvalidArgumentError(absl::StrCat("learner.pp: must be >= 1, got ", stages));
  if (chunks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("learner.pp_virtual_stages: must be >= 1, got ", chunks));
  }
  if (chunks > 1 && stages < 2) {
    return absl::InvalidArgumentError("learner.pp_virtual_stages: > 1 needs learner.pp > 1");
  }
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("learner.pp_microbatches: must be >= 1, got ", micro_batches));
  }
  return absl::OkStatus();
}

// The k-th forward (or backward) pass of the interleaved order: groups of
// P micro-batches, each group through the chunks in order (backwards: in
// reverse). REQUIRES: P divides the micro-batches.
PipelineOp Interleaved(int64_t k, bool forward, int stages, int chunks) {
  const int64_t per_group = static_cast<int64_t>(stages) * chunks, in_group = k % per_group;
  PipelineOp op;
  op.forward = forward;
  op.chunk = static_cast<int>(in_group / stages);
  op.micro = k / per_group * stages + in_group % stages;
  if (!forward) op.chunk = chunks - 1 - op.chunk;
  return op;
}

}  // namespace

absl::StatusOr<std::vector<PipelineOp>> PipelineSchedule(int stages, int stage, int chunks, int64_t micro_batches) {
  if (absl::Status s = CheckShape(stages, chunks, micro_batches); !s.ok()) return s;
  if (stage < 0 || stage >= stages) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", stage, " outside [0, ", stages, ")"));
  }
  if (chunks > 1 && micro_batches % stages != 0) {
    // The interleaved order deadlocks for some shapes whose last group is
    // partial (P = 4, V = 3, M = 5 the smallest). So run the order of the
    // next multiple of P without the passes of the micro-batches past M:
    // dropping passes from every stage's order cannot make a wait cycle
    // (any cycle would be one, through the dropped passes, of the whole
    // order, which has none).
    const int64_t whole = (micro_batches + stages - 1) / stages * stages;
    auto ops = PipelineSchedule(stages, stage, chunks, whole);
    if (!ops.ok()) return ops.status();
    ops->erase(std::remove_if(ops->begin(), ops->end(),
                              [&](const PipelineOp& op) { return op.micro >= micro_batches; }),
               ops->end());
    return ops;
  }
  const int64_t total = micro_batches * chunks;
  int64_t warmup = 0;
  if (chunks == 1) {
    warmup = std::min<int64_t>(stages - 1 - stage, total);
  } else if (micro_batches == stages) {
    warmup = total;
  } else {
    warmup = std::min<int64_t>(2 * (stages - 1 - stage) + static_cast<int64_t>(chunks - 1) * stages, total);
  }
  std::vector<PipelineOp> ops;
  ops.reserve(2 * total);
  auto op = [&](int64_t k, bool forward) {
    return chunks == 1 ? PipelineOp{forward, k, 0} : Interleaved(k, forward, stages, chunks);
  };
  int64_t f = 0, b = 0;
  while (f < warmup) ops.push_back(op(f++, true));
  while (f < total) {
    ops.push_back(op(f++, true));
    ops.push_back(op(b++, false));
  }
  while (b < total) ops.push_back(op(b++, false));
  return ops;
}

// Long because: the event simulation (stage cursors, the passes' end times
// and the in-flight counts) reads best as one loop.
absl::StatusOr<PipelineSimulation> SimulatePipeline(int stages, int chunks, int64_t micro_batches, double forward,
                                                    double backward, const std::vector<int64_t>& chunk_layers) {
  if (!chunk_layers.empty() && chunk_layers.size() != static_cast<size_t>(stages) * std::max(chunks, 0)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_layers: ", chunk_layers.size(), " entries for ", stages,
                                                   " x ", chunks, " chunks"));
  }
  std::vector<std::vector<PipelineOp>> schedule(stages);
  for (int s = 0; s < stages; ++s) {
    auto ops = PipelineSchedule(stages, s, chunks, micro_batches);
    if (!ops.ok()) return ops.status();
    schedule[s] = *std::move(ops);
  }
  const int last = stages * chunks - 1;
  // End times of the passes done: (forward, micro-batch, model chunk).
  std::map<std::tuple<bool, int64_t, int>, double> done;
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0.0);
  std::vector<int64_t> held(stages, 0), held_layers(stages, 0);
  PipelineSimulation sim;
  sim.max_in_flight.assign(stages, 0);
  sim.max_layers_in_flight.assign(stages, 0);
  size_t remaining = 0;
  for (const auto& ops : schedule) remaining += ops.size();
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < schedule[s].size()) {
        const PipelineOp& op = schedule[s][next[s]];
        const int c = op.chunk * stages + s;
        // The pass whose output this one takes.
        std::tuple<bool, int64_t, int> dep;
        bool has_dep = true;
        if (op.forward) {
          has_dep = c > 0;
          dep = {true, op.micro, c - 1};
        } else {
          dep = c < last ? std::make_tuple(false, op.micro, c + 1) : std::make_tuple(true, op.micro, c);
          // Its own forward must have run on this stage first.
          if (!done.count({true, op.micro, c})) {
            return absl::FailedPreconditionError(absl::StrCat("stage ", s, " runs backward ", op.micro, " of chunk ",
                                                              c, " before its forward"));
          }
        }
        double ready = free_at[s];
        if (has_dep) {
          auto it = done.find(dep);
          if (it == done.end()) break;
          ready = std::max(ready, it->second);
        }
        free_at[s] = ready + (op.forward ? forward : backward);
        done[{op.forward, op.micro, c}] = free_at[s];
        held[s] += op.forward ? 1 : -1;
        held_layers[s] += (op.forward ? 1 : -1) * (chunk_layers.empty() ? 1 : chunk_layers[c]);
        sim.max_in_flight[s] = std::max(sim.max_in_flight[s], held[s]);
        sim.max_layers_in_flight[s] = std::max(sim.max_layers_in_flight[s], held_layers[s]);
        ++next[s];
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      return absl::FailedPreconditionError(absl::StrCat("the pipeline schedule deadlocks at pp ", stages,
                                                        ", virtual stages ", chunks, ", ", micro_batches,
                                                        " micro-batches"));
    }
  }
  sim.makespan = *std::max_element(free_at.begin(), free_at.end());
  const double busy = static_cast<double>(micro_batches) * chunks * (forward + backward);
  sim.bubble = sim.makespan > 0 ? 1.0 - busy / sim.makespan : 0.0;
  return sim;
}

double TheoreticalBubble(int stages, int chunks, int64_t micro_batches) {
  return static_cast<double>(stages - 1) / (static_cast<double>(chunks) * micro_batches + stages - 1);
}

}  // namespace rlmesh::parallel
