// calc_eval: the calculator tool's evaluator. Reads one expression on stdin
// (at most kMaxExpressionChars + 1 bytes are read), writes its value on
// stdout and exits 0, or writes the reason on stdout and exits 1. The
// environment server runs it as a sandboxed child (environment/sandbox.h:
// CPU-time and address-space limits, no new processes, no writable files,
// a network namespace of its own where the kernel allows), so whatever an
// expression does, it can only kill this process.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/sanitizers.h"
#include "environment/expression.h"

#if RLMESH_ASAN
// In sanitizer builds (the fuzz and asan configs): LeakSanitizer's check at
// exit starts a tracer with clone(), which the sandbox's seccomp filter
// refuses, and the failed check would turn every answer into exit 1.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
#endif

int main() {
  std::string text;
  char buf[512];
  while (text.size() <= static_cast<size_t>(rlmesh::environment::kMaxExpressionChars)) {
    ssize_t n = ::read(0, buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  auto value = rlmesh::environment::EvaluateExpression(text);
  if (!value.ok()) {
    std::printf("%s\n", std::string(value.status().message()).c_str());
    return 1;
  }
  std::printf("%s\n", rlmesh::environment::FormatNumber(*value).c_str());
  return 0;
}
