#pragma once

// Where the loop's records go: one JSON object per line in
// <run_dir>/metrics.jsonl (unless logging.no_jsonl) and every number of a
// record as a TensorBoard scalar "<stage>/<key>" (logging.tensorboard) at
// the cumulative learner step. Not thread-safe: the runner's thread owns it.

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/tensorboard.h"
#include "nlohmann/json.hpp"

namespace rlmesh {

class MetricsSink {
 public:
  // Opens the sinks that are asked for; PERMISSION_DENIED when one cannot be
  // written. A sink left closed drops records.
  absl::Status Open(const std::string& run_dir, bool jsonl, bool tensorboard);
  // Writes one record (flushed).
  void Record(const nlohmann::json& record);
  // One learner step done: later TensorBoard scalars go to the next step.
  void NextStep() { ++step_; }

 private:
  std::ofstream jsonl_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  int64_t step_ = 0;
};

}  // namespace rlmesh
