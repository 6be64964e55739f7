#include "common/log.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

// An unbraced if/else around the macro. With a bare `if (!(cond)) ...`
// definition the `else` binds to the macro's hidden `if`, so x is set when
// `flag` is true and left alone when it is false: the opposite of what the
// code says.
int ElseAfterCheck(bool flag) {
  int x = 0;
  if (flag) RLMESH_CHECK(true); else x = 1;  // NOLINT(readability/braces)
  return x;
}

TEST_CASE("RLMESH_CHECK is one statement inside an unbraced if/else") {
  CHECK(ElseAfterCheck(false) == 1);
  CHECK(ElseAfterCheck(true) == 0);
}

int g_streamed = 0;
int CountStreamed() { return ++g_streamed; }

TEST_CASE("a passing RLMESH_CHECK evaluates neither the message nor aborts") {
  g_streamed = 0;
  RLMESH_CHECK(1 + 1 == 2) << "never built " << CountStreamed();
  CHECK(g_streamed == 0);
}

// Runs `RLMESH_CHECK(false)` in a child; returns its wait status and what it
// wrote to stderr.
int FailingCheckInChild(std::string* stderr_text) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Catch2 handles SIGABRT to report a crash; the child must just die.
    ::signal(SIGABRT, SIG_DFL);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    const int answer = 41;
    RLMESH_CHECK(answer == 42) << "answer=" << answer;
    ::_exit(0);  // Reached only if the check did not abort.
  }
  ::close(fds[1]);
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) stderr_text->append(buf, n);
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

TEST_CASE("a failing RLMESH_CHECK aborts with the condition and the message") {
  std::string err;
  const int status = FailingCheckInChild(&err);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  CHECK(err.find("check failed: answer == 42 answer=41") != std::string::npos);
  CHECK(err.find("log_test.cc:") != std::string::npos);
}

}  // namespace
}  // namespace rlmesh
