#include "common/subprocess.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Whether `pid` is gone or a zombie (killed, not yet reaped by init).
bool Dead(pid_t pid) {
  const std::string stat = ReadAll("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return true;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

SubprocessOptions Shell(const std::string& script) {
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", script};
  return o;
}

absl::Time In(absl::Duration d) { return absl::Now() + d; }

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

TEST_CASE("Run feeds stdin and keeps stdout and stderr apart") {
  SubprocessOptions o = Shell("cat; echo err >&2; exit 4");
  o.stdin_stream = Stdio::Pipe();
  o.stdout_stream = Stdio::Pipe();
  o.stderr_stream = Stdio::Pipe();
  auto r = Run(o, "hello\n", In(absl::Seconds(10)));
  REQUIRE(r.ok());
  CHECK_FALSE(r->timed_out);
  CHECK(DescribeWaitStatus(r->wait_status) == "exit 4");
  CHECK_FALSE(r->success());
  CHECK(r->stdout_text == "hello\n");
  CHECK(r->stderr_text == "err\n");

  // More than a pipe holds in both directions: writing and reading are
  // interleaved, or cat would block on a full stdout while we block on a
  // full stdin.
  const std::string big(1 << 20, 'x');
  SubprocessOptions cat;
  cat.argv = {"cat"};  // found on $PATH
  cat.stdin_stream = Stdio::Pipe();
  cat.stdout_stream = Stdio::Pipe();
  auto echoed = Run(cat, big, In(absl::Seconds(20)), int64_t{2} << 20);
  REQUIRE(echoed.ok());
  CHECK(echoed->success());
  CHECK(echoed->stdout_text == big);

  // Input without a stdin pipe is refused.
  CHECK(Run(Shell("true"), "x", In(absl::Seconds(10))).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a child that never reads its input neither kills nor blocks the caller") {
  const std::string big(1 << 20, '7');
  SubprocessOptions deaf = Shell("echo done");
  deaf.stdin_stream = Stdio::Pipe();
  deaf.stdout_stream = Stdio::Pipe();
  auto r = Run(deaf, big, In(absl::Seconds(10)));
  REQUIRE(r.ok());
  CHECK(r->success());
  CHECK(r->stdout_text == "done\n");

  SubprocessOptions stuck = Shell("exec sleep 30");
  stuck.stdin_stream = Stdio::Pipe();
  const absl::Time start = absl::Now();
  auto s = Run(stuck, big, In(absl::Milliseconds(300)));
  REQUIRE(s.ok());
  CHECK(s->timed_out);
  CHECK(absl::Now() - start < absl::Seconds(5));
}

TEST_CASE("streams from and to files and /dev/null") {
  testing::TempDir dir;
  std::ofstream(dir.File("in")) << "from a file\n";
  SubprocessOptions o;
  o.argv = {"/bin/cat"};
  o.stdin_stream = Stdio::File(dir.File("in"));
  o.stdout_stream = Stdio::File(dir.File("out"));
  auto r = Run(o, "", In(absl::Seconds(10)));
  REQUIRE(r.ok());
  CHECK(r->success());
  CHECK(ReadAll(dir.File("out")) == "from a file\n");

  SubprocessOptions null;
  null.argv = {"/bin/cat"};
  null.stdin_stream = Stdio::DevNull();
  null.stdout_stream = Stdio::Pipe();
  auto n = Run(null, "", In(absl::Seconds(10)));
  REQUIRE(n.ok());
  CHECK(n->success());
  CHECK(n->stdout_text.empty());

  o.stdin_stream = Stdio::File(dir.File("missing"));
  auto missing = Subprocess::Spawn(o);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message().find(dir.File("missing")) != absl::string_view::npos);
  o.stdin_stream = Stdio::Inherit();
  o.log_path = dir.File("log");
  CHECK(Subprocess::Spawn(o).status().message() == "log_path: set together with stdout_stream or stderr_stream");
}

TEST_CASE("the child runs in cwd; a missing cwd is an error naming it") {
  testing::TempDir dir;
  char* real = ::realpath(dir.path().c_str(), nullptr);
  REQUIRE(real != nullptr);
  const std::string want = std::string(real) + "\n";
  ::free(real);
  SubprocessOptions o = Shell("pwd -P");
  o.cwd = dir.path();
  o.stdout_stream = Stdio::Pipe();
  auto r = Run(o, "", In(absl::Seconds(10)));
  REQUIRE(r.ok());
  CHECK(r->stdout_text == want);

  o.cwd = dir.File("nope");
  auto missing = Subprocess::Spawn(o);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message().find("cwd " + dir.File("nope")) != absl::string_view::npos);
}

TEST_CASE("at the deadline the whole process group is killed and the child reaped") {
  // The grandchild holds stdout open too: only killing the group ends it.
  SubprocessOptions o = Shell("sleep 60 & echo $!; wait");
  o.stdout_stream = Stdio::Pipe();
  const absl::Time start = absl::Now();
  auto r = Run(o, "", In(absl::Milliseconds(500)));
  REQUIRE(r.ok());
  CHECK(r->timed_out);
  CHECK(DescribeWaitStatus(r->wait_status) == "signal 9");
  CHECK(absl::Now() - start < absl::Seconds(5));
  int grandchild = 0;
  REQUIRE(absl::SimpleAtoi(absl::StripAsciiWhitespace(r->stdout_text), &grandchild));
  bool dead = false;
  for (int i = 0; i < 100 && !dead; ++i) {
    dead = Dead(grandchild);
    if (!dead) absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(dead);
  if (!dead) ::kill(grandchild, SIGKILL);

  // A child that closed its output and kept running is killed too, at the
  // deadline, not waited for.
  SubprocessOptions closed = Shell("exec >&- 2>&-; sleep 60");
  closed.stdout_stream = Stdio::Pipe();
  closed.stderr_stream = Stdio::Pipe();
  const absl::Time t0 = absl::Now();
  auto c = Run(closed, "", In(absl::Milliseconds(300)));
  REQUIRE(c.ok());
  CHECK(c->timed_out);
  CHECK(absl::Now() - t0 < absl::Seconds(5));
}

TEST_CASE("the child leads a process group of its own unless told not to") {
  SubprocessOptions o;
  o.argv = {"/bin/sleep", "30"};
  auto own = Subprocess::Spawn(o);
  REQUIRE(own.ok());
  CHECK(::getpgid(own->pid()) == own->pid());
  o.own_process_group = false;
  auto shared = Subprocess::Spawn(o);
  REQUIRE(shared.ok());
  CHECK(::getpgid(shared->pid()) == ::getpgrp());
}

TEST_CASE("output beyond max_output_bytes is read and dropped") {
  // More than a pipe holds: the child finishes only if the rest is drained.
  SubprocessOptions o = Shell("head -c 300000 /dev/zero | tr '\\0' a; echo tail >&2");
  o.stdout_stream = Stdio::Pipe();
  o.stderr_stream = Stdio::Pipe();
  auto r = Run(o, "", In(absl::Seconds(10)), 10);
  REQUIRE(r.ok());
  CHECK_FALSE(r->timed_out);
  CHECK(r->success());
  CHECK(r->stdout_text == "aaaaaaaaaa");
  CHECK(r->stdout_truncated);
  CHECK(r->stderr_text == "tail\n");
  CHECK_FALSE(r->stderr_truncated);
}

// Sets the soft and hard RLIMIT_NOFILE to *arg, or exits 9 when asked to.
int LimitFiles(const void* arg) {
  const int n = *static_cast<const int*>(arg);
  if (n < 0) return 9;
  struct rlimit r;
  r.rlim_cur = r.rlim_max = static_cast<rlim_t>(n);
  return ::setrlimit(RLIMIT_NOFILE, &r) == 0 ? 0 : 8;
}

TEST_CASE("the child hook runs before exec; a non-zero return is the exit code") {
  int limit = 17;
  SubprocessOptions o = Shell("ulimit -n; echo ran");
  o.stdout_stream = Stdio::Pipe();
  o.child_hook = LimitFiles;
  o.child_hook_arg = &limit;
  auto r = Run(o, "", In(absl::Seconds(10)));
  REQUIRE(r.ok());
  CHECK(r->stdout_text == "17\nran\n");

  int refuse = -1;
  o.child_hook_arg = &refuse;
  auto refused = Run(o, "", In(absl::Seconds(10)));
  REQUIRE(refused.ok());
  CHECK(DescribeWaitStatus(refused->wait_status) == "exit 9");
  CHECK(refused->stdout_text.empty());  // the program never ran
}

TEST_CASE("inherit_env false gives the child only env; close_other_fds closes the rest") {
  SubprocessOptions o;
  o.argv = {"/usr/bin/env"};
  o.inherit_env = false;
  o.env = {"ONLY=this"};
  o.stdout_stream = Stdio::Pipe();
  auto r = Run(o, "", In(absl::Seconds(10)));
  REQUIRE(r.ok());
  CHECK(r->stdout_text == "ONLY=this\n");

  // An inheritable descriptor of ours: visible to the child unless closed.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  SubprocessOptions fd = Shell("[ -e /proc/self/fd/" + std::to_string(p[1]) + " ] && echo open || echo closed");
  fd.stdout_stream = Stdio::Pipe();
  auto leaked = Run(fd, "", In(absl::Seconds(10)));
  fd.close_other_fds = true;
  auto closed = Run(fd, "", In(absl::Seconds(10)));
  ::close(p[0]);
  ::close(p[1]);
  REQUIRE(leaked.ok());
  REQUIRE(closed.ok());
  CHECK(leaked->stdout_text == "open\n");
  CHECK(closed->stdout_text == "closed\n");
}

TEST_CASE("a program that cannot start is an error naming argv[0]") {
  testing::TempDir dir;
  SubprocessOptions o;
  o.argv = {"rlmesh-no-such-program"};
  auto not_on_path = Subprocess::Spawn(o);
  CHECK(not_on_path.status().code() == absl::StatusCode::kNotFound);
  CHECK(not_on_path.status().message().find("rlmesh-no-such-program") != absl::string_view::npos);

  // Executable, but not a program (no #! line): execve fails in the child
  // and the error comes back here.
  const std::string junk = dir.File("junk");
  std::ofstream(junk) << "\x7f\x01not an ELF";
  ::chmod(junk.c_str(), 0755);
  o.argv = {junk};
  auto bad = Subprocess::Spawn(o);
  CHECK(bad.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(bad.status().message().find(junk) != absl::string_view::npos);

  o.argv = {};
  CHECK(Subprocess::Spawn(o).status().message() == "argv: empty");
}

}  // namespace
}  // namespace rlmesh
