#include "common/subprocess.h"

#include <signal.h>
#include <sys/wait.h>

#include <fstream>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

TEST_CASE("exit codes are reported") {
  auto p = Subprocess::Start({"/bin/sh", "-c", "exit 3"});
  REQUIRE(p.ok());
  auto st = p->Wait(absl::Seconds(10));
  REQUIRE(st.ok());
  CHECK(DescribeWaitStatus(*st) == "exit 3");
}

TEST_CASE("Stop sends SIGTERM first and reaps") {
  auto p = Subprocess::Start({"/bin/sleep", "100"});
  REQUIRE(p.ok());
  CHECK(p->running());
  int st = p->Stop(absl::Seconds(5));
  CHECK(DescribeWaitStatus(st) == "signal 15");
  CHECK_FALSE(p->running());
}

TEST_CASE("Wait times out on a running child and the destructor kills it") {
  pid_t pid = 0;
  {
    auto p = Subprocess::Start({"/bin/sleep", "100"});
    REQUIRE(p.ok());
    pid = p->pid();
    auto st = p->Wait(absl::Milliseconds(50));
    CHECK(st.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
  // Reaped: the pid no longer names our child.
  CHECK(::waitpid(pid, nullptr, WNOHANG) == -1);
}

TEST_CASE("output goes to the log file and bad paths are errors") {
  testing::TempDir dir;
  auto p = Subprocess::Start({"/bin/sh", "-c", "echo hello; echo err >&2"}, dir.File("log"));
  REQUIRE(p.ok());
  REQUIRE(p->Wait(absl::Seconds(10)).ok());
  std::ifstream in(dir.File("log"));
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(all == "hello\nerr\n");

  auto missing = Subprocess::Start({dir.File("nope")});
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("ReadPortFile waits for the file and times out") {
  testing::TempDir dir;
  auto none = ReadPortFile(dir.File("port"), absl::Milliseconds(100));
  CHECK(none.status().code() == absl::StatusCode::kDeadlineExceeded);
  std::ofstream(dir.File("port")) << "4242\n";
  auto port = ReadPortFile(dir.File("port"), absl::Seconds(1));
  REQUIRE(port.ok());
  CHECK(*port == 4242);
}

}  // namespace
}  // namespace rlmesh
