#include "common/log.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rlmesh {
namespace {

std::string& Role() {
  static std::string* role = new std::string("rlmesh");
  return *role;
}

char SeverityChar(LogSeverity s) {
  switch (s) {
    case LogSeverity::kInfo: return 'I';
    case LogSeverity::kWarning: return 'W';
    case LogSeverity::kError: return 'E';
    case LogSeverity::kFatal: return 'F';
  }
  return '?';
}

}  // namespace

void SetLogRole(absl::string_view role) { Role() = std::string(role); }

LogMessage::LogMessage(LogSeverity severity, const char* file, int line)
    : severity_(severity) {
  const char* base = std::strrchr(file, '/');
  stream_ << SeverityChar(severity)
          << absl::FormatTime("%m%d %H:%M:%E3S", absl::Now(), absl::LocalTimeZone())
          << ' ' << Role() << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  // One write(2) per line so concurrent lines do not interleave.
  ssize_t unused = ::write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace rlmesh
