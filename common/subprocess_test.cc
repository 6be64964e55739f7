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

TEST_CASE("env entries replace or add to the inherited environment") {
  testing::TempDir dir;
  ::setenv("RLMESH_SUBPROCESS_TEST_KEEP", "kept", 1);
  ::setenv("RLMESH_SUBPROCESS_TEST_SET", "old", 1);
  auto p = Subprocess::Start(
      {"/bin/sh", "-c",
       "echo \"$RLMESH_SUBPROCESS_TEST_KEEP $RLMESH_SUBPROCESS_TEST_SET $CUDA_VISIBLE_DEVICES\"; "
       "env | grep -c '^RLMESH_SUBPROCESS_TEST_SET='"},
      dir.File("log"), {"RLMESH_SUBPROCESS_TEST_SET=new", "CUDA_VISIBLE_DEVICES=3"});
  REQUIRE(p.ok());
  REQUIRE(p->Wait(absl::Seconds(10)).ok());
  std::ifstream in(dir.File("log"));
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(all == "kept new 3\n1\n");  // replaced once, not appended twice
  ::unsetenv("RLMESH_SUBPROCESS_TEST_KEEP");
  ::unsetenv("RLMESH_SUBPROCESS_TEST_SET");

  CHECK(Subprocess::Start({"/bin/true"}, "", {"NOVALUE"}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Subprocess::Start({"/bin/true"}, "", {"=x"}).status().code() == absl::StatusCode::kInvalidArgument);
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
