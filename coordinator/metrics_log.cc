#include "coordinator/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace rlmesh {

absl::StatusOr<MetricsPage> ReadMetricsPage(const std::string& path, int64_t from, int limit) {
  if (from < 0) return absl::InvalidArgumentError(absl::StrCat("from_record: ", from, " is negative"));
  if (limit <= 0) return absl::InvalidArgumentError(absl::StrCat("limit: ", limit, " is not positive"));
  MetricsPage page;
  page.next = from;
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return page;
    return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::string line;
  int64_t index = 0;
  while (static_cast<int64_t>(page.records.size()) < limit && std::getline(in, line)) {
    // getline also returns a last line that has no newline: a record the
    // runner is still writing.
    if (in.eof()) break;
    if (index++ < from) continue;
    page.records.push_back(std::move(line));
    page.next = index;
  }
  return page;
}

absl::StatusOr<MetricsPage> ReadExperimentMetrics(const ExperimentStatus& experiment, int64_t from, int limit) {
  if (experiment.run_dir().empty()) {
    if (from < 0) return absl::InvalidArgumentError(absl::StrCat("from_record: ", from, " is negative"));
    return MetricsPage{{}, from};
  }
  return ReadMetricsPage(experiment.run_dir() + "/metrics.jsonl", from, limit);
}

}  // namespace rlmesh
