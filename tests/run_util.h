#pragma once

// Helpers for the tests that drive `coordinator run` as a subprocess and
// read what it leaves in its run directory.

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rlmesh::testing {

// The whole file, or "" when it cannot be read.
std::string ReadAll(const std::string& path);

// The one experiment folder under `root` ("" if none yet).
std::string RunDir(const std::string& root);

// Highest step of `stage` in a run's metrics.jsonl (0 if none).
int LastStep(const std::string& run_dir, const std::string& stage);

// Runs `coordinator run CONFIG --run_dir=ROOT ARGS...` to the end (at most
// `limit`), its output in `out_file`; returns the raw wait status (0 =
// exited 0).
absl::StatusOr<int> RunExperiment(const std::string& config, const std::string& root,
                                  const std::vector<std::string>& args, const std::string& out_file,
                                  absl::Duration limit);

// metrics.jsonl with the wall-clock fields (time, seconds_*,
// tokens_per_second) removed: one line per record, in order.
std::vector<std::string> MetricsWithoutClock(const std::string& run_dir);

// The coordinator's address from `coordinator run`'s output (its "cluster up
// (coordinator HOST:PORT)" line); "" when the line is not there yet.
std::string CoordinatorAddress(const std::string& run_output);

// The checkpoint folder a stage ended with (its stage-I.done.json marker).
std::string StageCheckpoint(const std::string& run_dir, int stage_index);

}  // namespace rlmesh::testing
