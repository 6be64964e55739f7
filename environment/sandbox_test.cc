// The sandbox against a misbehaving child (testdata/hog_main.cc): every
// limit ends the child and comes back as a result, never a crash or hang.
#include "environment/sandbox.h"

#include <signal.h>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh::environment {
namespace {

std::string Hog() { return testing::Runfile("environment/sandbox_hog"); }

TEST_CASE("the evaluator runs in the sandbox and prints the value") {
  auto r = RunSandboxed({testing::Runfile("environment/calc_eval")}, "12*34", SandboxLimits{});
  REQUIRE(r.ok());
  CHECK(r->ok());
  CHECK(r->stdout_text == "408\n");
  auto bad = RunSandboxed({testing::Runfile("environment/calc_eval")}, "1/0", SandboxLimits{});
  REQUIRE(bad.ok());
  CHECK(bad->exit_code == 1);
  CHECK(bad->stdout_text.find("division by zero") != std::string::npos);
}

TEST_CASE("an infinite loop is killed at the CPU limit") {
  SandboxLimits l;
  l.cpu_seconds = 1;
  l.wall_timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  auto r = RunSandboxed({Hog()}, "spin", l);
  REQUIRE(r.ok());
  CHECK_FALSE(r->ok());
  CHECK_FALSE(r->timed_out);
  CHECK((r->signal == SIGXCPU || r->signal == SIGKILL));
  CHECK(r->Describe().find("CPU time limit") != std::string::npos);
  CHECK(absl::Now() - start < absl::Seconds(30));
}

TEST_CASE("a huge allocation is refused inside the child") {
  SandboxLimits l;
  l.address_space_bytes = int64_t{64} << 20;
  auto r = RunSandboxed({Hog()}, "alloc", l);
  REQUIRE(r.ok());
  CHECK(r->exit_code == 3);
  CHECK(r->stdout_text == "allocation refused\n");
}

TEST_CASE("a child that blocks is killed at the wall-clock limit") {
  SandboxLimits l;
  l.wall_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto r = RunSandboxed({Hog()}, "sleep", l);
  REQUIRE(r.ok());
  CHECK(r->timed_out);
  CHECK(r->signal == SIGKILL);
  CHECK(r->Describe() == "killed: wall-clock limit");
  CHECK(absl::Now() - start < absl::Seconds(3));
}

TEST_CASE("the child can neither start processes nor write files") {
  auto f = RunSandboxed({Hog()}, "fork", SandboxLimits{});
  REQUIRE(f.ok());
  CHECK(f->stdout_text == "fork refused\n");
  auto w = RunSandboxed({Hog()}, "write", SandboxLimits{});
  REQUIRE(w.ok());
  CHECK(w->stdout_text == "write refused\n");
}

TEST_CASE("output is capped and bad arguments are refused") {
  SandboxLimits l;
  l.max_output_bytes = 3;
  auto r = RunSandboxed({Hog()}, "echo-this", l);
  REQUIRE(r.ok());
  CHECK(r->stdout_text == "ech");
  CHECK(RunSandboxed({"calc_eval"}, "1", SandboxLimits{}).status().code() == absl::StatusCode::kInvalidArgument);
  SandboxLimits zero;
  zero.cpu_seconds = 0;
  CHECK(RunSandboxed({Hog()}, "echo", zero).status().message() == "cpu_seconds: must be > 0");
  auto missing = RunSandboxed({"/nonexistent/evaluator"}, "1", SandboxLimits{});
  REQUIRE(missing.ok());
  CHECK(missing->Describe() == "the evaluator could not be started");
}

TEST_CASE("network isolation is either in force or reported as unavailable") {
  // Which one applies depends on the kernel; the child must be refused
  // when isolation is required and unavailable, and run when available.
  SandboxLimits l;
  l.require_network_isolation = true;
  auto r = RunSandboxed({Hog()}, "echo", l);
  REQUIRE(r.ok());
  if (NetworkIsolationWorks()) {
    CHECK(r->ok());
    // The seccomp filter (or an empty namespace) keeps sockets away.
    auto net = RunSandboxed({Hog()}, "net", SandboxLimits{});
    REQUIRE(net.ok());
    CHECK(net->stdout_text == "socket refused\n");
  } else {
    CHECK(r->Describe() == "refused: no network namespace available");
  }
}

}  // namespace
}  // namespace rlmesh::environment
