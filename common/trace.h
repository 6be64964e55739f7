#pragma once

// A process-wide recorder of spans in the Chrome trace-event format (what
// Perfetto and chrome://tracing open): {"traceEvents": [{"name", "cat",
// "ph": "X", "ts", "dur", "pid", "tid", "args"}, ...]}. Off unless a process
// enables it (every server binary: --trace_file), so a span costs one
// relaxed load when tracing is off.
//
// Timestamps are wall-clock microseconds since the Unix epoch, so the files
// of several processes on one host merge onto one time axis (MergeTraces).
//
//   void Step() {
//     TraceSpan span("train_step", "learner");
//     ...
//   }

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlmesh {

// Starts recording for this process; `process_name` labels its track.
// Events beyond `max_events` are dropped (and counted in the file's
// metadata) so a long run cannot exhaust memory. Thread-safe.
void EnableTracing(const std::string& path, const std::string& process_name, int64_t max_events = 2'000'000);
bool TracingEnabled();

// Records one complete span. Thread-safe; a no-op when tracing is off.
void RecordSpan(absl::string_view name, absl::string_view category, int64_t start_unix_micros,
                int64_t duration_micros, absl::string_view args_json = "");

// Writes what was recorded to the enabled path (atomically: a reader never
// sees half a file). Safe to call more than once; OK when tracing is off.
absl::Status FlushTrace();

// Records a span from construction to destruction. Not copyable.
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  int64_t start_ = -1;  // -1 = tracing was off at construction
};

// Merges trace files (each {"traceEvents": [...]}) into one at `out`, every
// input's events kept with their own pid; returns the number of events.
// INVALID_ARGUMENT naming the file that is not a trace.
absl::StatusOr<int64_t> MergeTraces(const std::vector<std::string>& inputs, const std::string& out);

}  // namespace rlmesh
