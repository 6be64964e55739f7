#pragma once

// Reading a run's metrics.jsonl a page at a time, for GetMetrics (and
// anything else that serves a run's curves). The runner appends one JSON
// object per line; a reader may see the file mid-write, so a last line
// without its newline is not returned yet.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/coordinator.pb.h"

namespace rlmesh {

struct MetricsPage {
  // Complete lines [from, from + records.size()), without their newline.
  std::vector<std::string> records;
  // Index of the first line not returned.
  int64_t next = 0;
};

// Lines `from` .. `from + limit - 1` of the file at `path`. A missing file
// is an empty page (the run has not written a record yet). INVALID_ARGUMENT
// for from < 0 or limit <= 0. Reads the file from its start: metrics files
// hold one line per step, thousands at most.
absl::StatusOr<MetricsPage> ReadMetricsPage(const std::string& path, int64_t from, int limit);

// The same page of an experiment's metrics.jsonl in its run directory; an
// experiment still queued (no run directory yet) has an empty page.
absl::StatusOr<MetricsPage> ReadExperimentMetrics(const ExperimentStatus& experiment, int64_t from, int limit);

}  // namespace rlmesh
