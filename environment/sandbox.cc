#include "environment/sandbox.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace rlmesh::environment {
namespace {

constexpr int kNoNetworkExit = 126;
constexpr int kExecFailedExit = 127;

#if defined(__x86_64__)
#define RLMESH_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define RLMESH_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

#define RLMESH_DENY(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)

// A seccomp filter: no new processes or threads, no sockets (so no network
// even where namespaces are unavailable), no ptrace. Everything else is
// allowed; a syscall of another architecture kills the process.
#ifdef RLMESH_AUDIT_ARCH
const struct sock_filter kFilter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, RLMESH_AUDIT_ARCH, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    RLMESH_DENY(__NR_clone),
#ifdef __NR_clone3
    RLMESH_DENY(__NR_clone3),
#endif
#ifdef __NR_fork
    RLMESH_DENY(__NR_fork),
#endif
#ifdef __NR_vfork
    RLMESH_DENY(__NR_vfork),
#endif
    RLMESH_DENY(__NR_socket),
    RLMESH_DENY(__NR_socketpair),
    RLMESH_DENY(__NR_ptrace),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};
#endif

// Installs kFilter; false where seccomp is unavailable.
bool InstallFilter() {
#ifdef RLMESH_AUDIT_ARCH
  struct sock_fprog prog;
  prog.len = static_cast<unsigned short>(sizeof(kFilter) / sizeof(kFilter[0]));
  prog.filter = const_cast<struct sock_filter*>(kFilter);
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
#else
  return false;
#endif
}

// Child side, between fork and exec: only async-signal-safe calls.
[[noreturn]] void RunChild(char* const* argv, int in_fd, int out_fd, int err_fd, const SandboxLimits& limits) {
  // A namespace first (it may need a process count the limits forbid).
  bool isolated = ::unshare(CLONE_NEWNET) == 0 || ::unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0;
  // Its own process group, so the parent can kill whatever it left behind.
  ::setpgid(0, 0);
  // The server blocks termination signals in its threads; the child starts
  // with none blocked, and a write past RLIMIT_FSIZE fails (EFBIG) instead
  // of killing it with SIGXFSZ.
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGXFSZ, SIG_IGN);
  ::dup2(in_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  // Everything else the server had open (listening sockets, files) goes.
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  struct rlimit r;
  r.rlim_cur = r.rlim_max = static_cast<rlim_t>(limits.cpu_seconds);
  ::setrlimit(RLIMIT_CPU, &r);
  r.rlim_cur = r.rlim_max = static_cast<rlim_t>(limits.address_space_bytes);
  ::setrlimit(RLIMIT_AS, &r);
  r.rlim_cur = r.rlim_max = 0;
  ::setrlimit(RLIMIT_FSIZE, &r);
  ::setrlimit(RLIMIT_CORE, &r);
  ::setrlimit(RLIMIT_NPROC, &r);
  r.rlim_cur = r.rlim_max = 8;
  ::setrlimit(RLIMIT_NOFILE, &r);
  // Last: the filter forbids what the steps above needed.
  const bool filtered = InstallFilter();
  if (!isolated && !filtered && limits.require_network_isolation) _exit(kNoNetworkExit);
  char* const env[] = {nullptr};
  ::execve(argv[0], argv, env);
  _exit(kExecFailedExit);
}

// Appends what is readable on `fd` to `out` (up to `cap` kept); false at EOF.
bool Drain(int fd, std::string* out, int64_t cap) {
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof(buf));
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  const int64_t room = cap - static_cast<int64_t>(out->size());
  if (room > 0) out->append(buf, static_cast<size_t>(std::min<int64_t>(room, n)));
  return true;
}

}  // namespace

absl::Status SandboxLimits::Validate() const {
  if (cpu_seconds <= 0) return absl::InvalidArgumentError("cpu_seconds: must be > 0");
  if (address_space_bytes < (int64_t{16} << 20)) {
    return absl::InvalidArgumentError("address_space_bytes: must be >= 16 MiB (the evaluator must load)");
  }
  if (wall_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("wall_timeout: must be > 0");
  if (max_output_bytes <= 0) return absl::InvalidArgumentError("max_output_bytes: must be > 0");
  return absl::OkStatus();
}

std::string SandboxResult::Describe() const {
  if (timed_out) return "killed: wall-clock limit";
  if (signal == SIGXCPU || signal == SIGKILL) return absl::StrCat("killed: CPU time limit (signal ", signal, ")");
  if (signal != 0) return absl::StrCat("killed by signal ", signal);
  if (exit_code == kNoNetworkExit) return "refused: no network namespace available";
  if (exit_code == kExecFailedExit) return "the evaluator could not be started";
  return absl::StrCat("exit ", exit_code);
}

absl::StatusOr<SandboxResult> RunSandboxed(const std::vector<std::string>& argv, const std::string& input,
                                           const SandboxLimits& limits) {
  if (argv.empty() || argv[0].empty() || argv[0][0] != '/') {
    return absl::InvalidArgumentError("argv[0]: must be an absolute path");
  }
  if (absl::Status s = limits.Validate(); !s.ok()) return s;
  // Everything the child needs is built before fork (no allocation after).
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) ::close(fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) RunChild(cargv.data(), in[0], out[1], err[1], limits);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  // The input is small (an expression); a child that does not read it gets
  // EPIPE on our side, not a hang: the write end is non-blocking.
  ::fcntl(in[1], F_SETFL, O_NONBLOCK);
  ::signal(SIGPIPE, SIG_IGN);
  (void)!::write(in[1], input.data(), input.size());
  ::close(in[1]);

  SandboxResult result;
  const absl::Time deadline = absl::Now() + limits.wall_timeout;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      result.timed_out = true;
      break;
    }
    struct pollfd fds[2] = {{out_open ? out[0] : -1, POLLIN, 0}, {err_open ? err[0] : -1, POLLIN, 0}};
    const int ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(left)));
    const int ready = ::poll(fds, 2, ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    if (out_open && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      out_open = Drain(out[0], &result.stdout_text, limits.max_output_bytes);
    }
    if (err_open && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      err_open = Drain(err[0], &result.stderr_text, limits.max_output_bytes);
    }
  }
  ::close(out[0]);
  ::close(err[0]);
  if (result.timed_out) ::kill(-pid, SIGKILL);
  int status = 0;
  // The child closed its output (or was killed): it ends promptly; a child
  // that closed stdout and kept running is killed at the deadline.
  while (true) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (absl::Now() > deadline) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

bool NetworkIsolationWorks() {
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    const bool ns = ::unshare(CLONE_NEWNET) == 0 || ::unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0;
    _exit(ns || InstallFilter() ? 0 : 1);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace rlmesh::environment
