#pragma once

// rlmesh's one logging facility. Named RLMESH_LOG so that it never collides
// with c10's LOG/CHECK macros in files that include LibTorch.
//
//   RLMESH_LOG(INFO) << "listening port=" << port;
//
// Lines go to stderr as "I1129 14:47:37.123 role] message". Safe for
// concurrent use (one write(2) per line).

#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace rlmesh {

enum class LogSeverity { kInfo, kWarning, kError, kFatal };

// Name printed in every line (the process's role); set once in main.
void SetLogRole(absl::string_view role);

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

}  // namespace rlmesh

#define RLMESH_LOG_SEVERITY_INFO ::rlmesh::LogSeverity::kInfo
#define RLMESH_LOG_SEVERITY_WARNING ::rlmesh::LogSeverity::kWarning
#define RLMESH_LOG_SEVERITY_ERROR ::rlmesh::LogSeverity::kError
#define RLMESH_LOG_SEVERITY_FATAL ::rlmesh::LogSeverity::kFatal

#define RLMESH_LOG(severity) \
  ::rlmesh::LogMessage(RLMESH_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()

// Aborts with a message when a true invariant does not hold:
//
//   RLMESH_CHECK(n > 0) << "n=" << n;
//
// The message is built only when the check fails. The macro is one complete
// if/else, so an `else` written after it in an unbraced `if` binds to that
// outer `if`, not to a hidden one inside the macro.
#define RLMESH_CHECK(cond) \
  if (cond) {              \
  } else                   \
    RLMESH_LOG(FATAL) << "check failed: " #cond " "
