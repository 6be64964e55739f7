#include "common/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

struct Event {
  std::string name;
  std::string category;
  int64_t ts;
  int64_t dur;
  int64_t tid;
  std::string args;
};

// The one recorder of the process. Its fields are guarded by mu except
// `enabled`, which spans read without the lock.
struct Recorder {
  std::atomic<bool> enabled{false};
  absl::Mutex mu;
  std::string path ABSL_GUARDED_BY(mu);
  std::string process_name ABSL_GUARDED_BY(mu);
  int64_t max_events ABSL_GUARDED_BY(mu) = 0;
  int64_t dropped ABSL_GUARDED_BY(mu) = 0;
  std::vector<Event> events ABSL_GUARDED_BY(mu);
};

Recorder& R() {
  static Recorder* r = new Recorder();  // never destroyed: spans may end during exit
  return *r;
}

std::string Escape(absl::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void EnableTracing(const std::string& path, const std::string& process_name, int64_t max_events) {
  Recorder& r = R();
  absl::MutexLock lock(&r.mu);
  r.path = path;
  r.process_name = process_name;
  r.max_events = max_events;
  r.enabled.store(true, std::memory_order_release);
}

bool TracingEnabled() { return R().enabled.load(std::memory_order_acquire); }

void RecordSpan(absl::string_view name, absl::string_view category, int64_t start_unix_micros,
                int64_t duration_micros, absl::string_view args_json) {
  Recorder& r = R();
  if (!r.enabled.load(std::memory_order_relaxed)) return;
  const int64_t tid = static_cast<int64_t>(::syscall(SYS_gettid));
  absl::MutexLock lock(&r.mu);
  if (static_cast<int64_t>(r.events.size()) >= r.max_events) {
    ++r.dropped;
    return;
  }
  r.events.push_back({std::string(name), std::string(category), start_unix_micros, duration_micros, tid,
                      std::string(args_json)});
}

absl::Status FlushTrace() {
  Recorder& r = R();
  if (!r.enabled.load(std::memory_order_acquire)) return absl::OkStatus();
  std::string out;
  std::string path;
  {
    absl::MutexLock lock(&r.mu);
    path = r.path;
    const int64_t pid = ::getpid();
    out = absl::StrCat("{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", pid,
                       ",\"tid\":0,\"args\":{\"name\":", Escape(r.process_name), "}}");
    for (const Event& e : r.events) {
      absl::StrAppend(&out, ",\n{\"name\":", Escape(e.name), ",\"cat\":", Escape(e.category),
                      ",\"ph\":\"X\",\"ts\":", e.ts, ",\"dur\":", e.dur, ",\"pid\":", pid, ",\"tid\":", e.tid);
      if (!e.args.empty()) absl::StrAppend(&out, ",\"args\":", e.args);
      out += "}";
    }
    absl::StrAppend(&out, "\n],\"otherData\":{\"process\":", Escape(r.process_name), ",\"dropped_events\":",
                    r.dropped, "}}\n");
  }
  return WriteFileAtomically(path, out);
}

TraceSpan::TraceSpan(const char* name, const char* category) : name_(name), category_(category) {
  if (TracingEnabled()) start_ = absl::ToUnixMicros(absl::Now());
}

TraceSpan::~TraceSpan() {
  if (start_ < 0) return;
  RecordSpan(name_, category_, start_, absl::ToUnixMicros(absl::Now()) - start_);
}

absl::StatusOr<int64_t> MergeTraces(const std::vector<std::string>& inputs, const std::string& out) {
  nlohmann::json merged = nlohmann::json::object();
  merged["traceEvents"] = nlohmann::json::array();
  merged["otherData"] = nlohmann::json::object();
  int64_t count = 0;
  for (const std::string& path : inputs) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read trace ", path));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not a trace-event file"));
    }
    for (auto& e : j["traceEvents"]) {
      if (e.value("ph", "") != "M") ++count;
      merged["traceEvents"].push_back(std::move(e));
    }
    if (j.contains("otherData")) merged["otherData"][path] = j["otherData"];
  }
  absl::Status written = WriteFileAtomically(out, merged.dump() + "\n");
  if (!written.ok()) return written;
  return count;
}

}  // namespace rlmesh
