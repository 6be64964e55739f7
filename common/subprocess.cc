#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace rlmesh {
namespace {

// A Status for a failed system call on `what`, its code chosen by errno.
absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EMFILE:
    case ENFILE:
    case EAGAIN:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// argv[0] as a path: itself if it has a '/', else the first executable
// match on $PATH; empty when there is none.
std::string FindInPath(const std::string& command) {
  if (command.find('/') != std::string::npos) return command;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", command);
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

// Closes `fd` if open and sets it to -1.
void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

// The descriptors Spawn prepares before fork; closes what it holds.
struct ChildFds {
  // The child's ends (-1 = inherit), each above 2 and close-on-exec.
  int child[3] = {-1, -1, -1};
  // This process's ends of pipes.
  int parent[3] = {-1, -1, -1};
  ~ChildFds() {
    for (int& fd : child) CloseFd(&fd);
    for (int& fd : parent) CloseFd(&fd);
  }
};

// `fd` moved above 2 (so that dup2 onto 0..2 cannot clobber another source),
// close-on-exec; closes the original. -1 on failure (errno set).
int AboveStdio(int fd) {
  if (fd < 0 || fd > 2) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return moved;
}

const char* StreamName(int target) { return target == 0 ? "stdin" : target == 1 ? "stdout" : "stderr"; }

// Opens the child's end of stream `target` (0, 1, 2) into fds.
absl::Status PrepareStream(const Stdio& s, int target, ChildFds* fds) {
  int fd = -1;
  switch (s.mode) {
    case Stdio::Mode::kInherit:
      return absl::OkStatus();
    case Stdio::Mode::kDevNull:
      fd = ::open("/dev/null", (target == 0 ? O_RDONLY : O_WRONLY) | O_CLOEXEC);
      if (fd < 0) return ErrnoStatus(errno, absl::StrCat(StreamName(target), ": open /dev/null"));
      break;
    case Stdio::Mode::kFile:
      fd = target == 0 ? ::open(s.path.c_str(), O_RDONLY | O_CLOEXEC)
                       : ::open(s.path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0) return ErrnoStatus(errno, absl::StrCat(StreamName(target), ": cannot open ", s.path));
      break;
    case Stdio::Mode::kPipe: {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoStatus(errno, absl::StrCat(StreamName(target), ": pipe"));
      fd = target == 0 ? p[0] : p[1];
      fds->parent[target] = target == 0 ? p[1] : p[0];
      break;
    }
  }
  fds->child[target] = AboveStdio(fd);
  if (fds->child[target] < 0) return ErrnoStatus(errno, absl::StrCat(StreamName(target), ": fcntl"));
  return absl::OkStatus();
}

// What the child reports on the error pipe when it cannot exec.
enum ChildStage : int { kStageStdio = 1, kStageCwd = 2, kStageExec = 3 };

// Child side, between fork and exec: async-signal-safe calls only; every
// argument was built before fork.
[[noreturn]] void RunChild(const SubprocessOptions& o, pid_t parent, const ChildFds& fds, int error_fd,
                           int max_fd, const char* exe, char* const* argv, char* const* envp) {
  auto fail = [error_fd](int stage) {
    const int report[2] = {stage, errno};
    (void)!::write(error_fd, report, sizeof(report));
    ::_exit(127);
  };
  if (o.die_with_parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
  }
  if (o.own_process_group) ::setpgid(0, 0);
  // This process may block termination signals in its threads and ignore
  // SIGPIPE; the program starts with neither (an ignored signal stays
  // ignored across exec).
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  for (int target = 0; target < 3; ++target) {
    if (fds.child[target] >= 0 && ::dup2(fds.child[target], target) < 0) fail(kStageStdio);
  }
  if (o.close_other_fds) {
    bool closed = false;
#ifdef SYS_close_range
    closed = (error_fd == 3 || ::syscall(SYS_close_range, 3u, static_cast<unsigned>(error_fd) - 1, 0u) == 0) &&
             ::syscall(SYS_close_range, static_cast<unsigned>(error_fd) + 1, ~0u, 0u) == 0;
#endif
    for (int fd = 3; !closed && fd < max_fd; ++fd) {
      if (fd != error_fd) ::close(fd);
    }
  }
  if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) fail(kStageCwd);
  if (o.child_hook != nullptr) {
    const int code = o.child_hook(o.child_hook_arg);
    if (code != 0) ::_exit(code);
  }
  ::execve(exe, argv, envp);
  fail(kStageExec);
  ::_exit(127);  // not reached
}

}  // namespace

absl::Status SubprocessOptions::Validate() const {
  if (argv.empty()) return absl::InvalidArgumentError("argv: empty");
  if (argv[0].empty()) return absl::InvalidArgumentError("argv[0]: empty");
  for (const std::string& kv : env) {
    if (kv.find('=') == std::string::npos || kv.front() == '=') {
      return absl::InvalidArgumentError(absl::StrCat("env: \"", kv, "\" is not NAME=VALUE"));
    }
  }
  const std::pair<const char*, const Stdio*> streams[] = {
      {"stdin_stream", &stdin_stream}, {"stdout_stream", &stdout_stream}, {"stderr_stream", &stderr_stream}};
  for (const auto& [name, s] : streams) {
    if (s->mode == Stdio::Mode::kFile && s->path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": a file needs a path"));
    }
  }
  if (!log_path.empty() &&
      (stdout_stream.mode != Stdio::Mode::kInherit || stderr_stream.mode != Stdio::Mode::kInherit)) {
    return absl::InvalidArgumentError("log_path: set together with stdout_stream or stderr_stream");
  }
  return absl::OkStatus();
}

absl::StatusOr<Subprocess> Subprocess::Spawn(const SubprocessOptions& o) {
  if (absl::Status s = o.Validate(); !s.ok()) return s;
  const std::string exe = FindInPath(o.argv[0]);
  if (exe.empty()) return absl::NotFoundError(absl::StrCat("argv[0]: '", o.argv[0], "' not found on $PATH"));
  if (::access(exe.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("argv[0]: not an executable: ", exe));
  }
  ChildFds fds;
  const Stdio out = o.log_path.empty() ? o.stdout_stream : Stdio::File(o.log_path);
  if (absl::Status s = PrepareStream(o.stdin_stream, 0, &fds); !s.ok()) return s;
  if (absl::Status s = PrepareStream(out, 1, &fds); !s.ok()) return s;
  if (o.log_path.empty()) {
    if (absl::Status s = PrepareStream(o.stderr_stream, 2, &fds); !s.ok()) return s;
  } else {
    // One descriptor for both, so their lines interleave as written.
    fds.child[2] = ::fcntl(fds.child[1], F_DUPFD_CLOEXEC, 3);
    if (fds.child[2] < 0) return ErrnoStatus(errno, "stderr: fcntl");
  }
  // Reports why the child could not exec; closed by a successful exec.
  int error_pipe[2];
  if (::pipe2(error_pipe, O_CLOEXEC) != 0) return ErrnoStatus(errno, "pipe");
  error_pipe[0] = AboveStdio(error_pipe[0]);
  error_pipe[1] = AboveStdio(error_pipe[1]);
  if (error_pipe[0] < 0 || error_pipe[1] < 0) {
    const int err = errno;
    CloseFd(&error_pipe[0]);
    CloseFd(&error_pipe[1]);
    return ErrnoStatus(err, "pipe");
  }

  // Everything the child needs, built before fork: the child only calls
  // async-signal-safe functions.
  std::vector<char*> cargv;
  for (const auto& a : o.argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<std::string> child_env;
  if (o.inherit_env) {
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv(*e);
      const size_t eq = kv.find('=');
      const std::string prefix = eq == std::string::npos ? kv + "=" : kv.substr(0, eq + 1);
      bool replaced = false;
      for (const std::string& v : o.env) replaced = replaced || v.compare(0, prefix.size(), prefix) == 0;
      if (!replaced) child_env.push_back(kv);
    }
  }
  for (const std::string& v : o.env) child_env.push_back(v);
  std::vector<char*> cenv;
  for (const auto& kv : child_env) cenv.push_back(const_cast<char*>(kv.c_str()));
  cenv.push_back(nullptr);
  int max_fd = 1024;
  struct rlimit nofile;
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY) {
    max_fd = static_cast<int>(std::min<rlim_t>(nofile.rlim_cur, 1 << 16));
  }
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    CloseFd(&error_pipe[0]);
    CloseFd(&error_pipe[1]);
    return ErrnoStatus(err, "fork");
  }
  if (pid == 0) RunChild(o, parent, fds, error_pipe[1], max_fd, exe.c_str(), cargv.data(), cenv.data());

  // Also here, so that the group exists before this returns whatever the
  // scheduler did (EACCES once the child has exec'd: it set it itself).
  if (o.own_process_group) ::setpgid(pid, pid);
  Subprocess proc(pid, o.own_process_group);
  CloseFd(&error_pipe[1]);
  int report[2] = {0, 0};
  ssize_t n;
  do {
    n = ::read(error_pipe[0], report, sizeof(report));
  } while (n < 0 && errno == EINTR);
  CloseFd(&error_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(report))) {
    // The child is exiting (127); `proc` reaps it on return.
    switch (report[0]) {
      case kStageCwd:
        return ErrnoStatus(report[1], absl::StrCat("cwd ", o.cwd));
      case kStageStdio:
        return ErrnoStatus(report[1], "dup2 of a standard stream");
      default: {
        // ENOMEM or E2BIG here say more about the program (or a limit the
        // hook set) than about this process: FAILED_PRECONDITION.
        absl::Status s = ErrnoStatus(report[1], absl::StrCat("argv[0] ", exe, ": execve"));
        if (s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kPermissionDenied) return s;
        return absl::FailedPreconditionError(s.message());
      }
    }
  }
  proc.stdin_fd_ = fds.parent[0];
  proc.stdout_fd_ = fds.parent[1];
  proc.stderr_fd_ = fds.parent[2];
  fds.parent[0] = fds.parent[1] = fds.parent[2] = -1;
  return proc;
}

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv, const std::string& log_path,
                                             const std::vector<std::string>& env) {
  SubprocessOptions o;
  o.argv = argv;
  o.log_path = log_path;
  o.env = env;
  return Spawn(o);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_),
      own_group_(other.own_group_),
      exit_status_(other.exit_status_),
      stdin_fd_(other.stdin_fd_),
      stdout_fd_(other.stdout_fd_),
      stderr_fd_(other.stderr_fd_) {
  other.pid_ = -1;
  other.stdin_fd_ = other.stdout_fd_ = other.stderr_fd_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !exit_status_) Stop(absl::ZeroDuration());
    CloseFds();
    pid_ = other.pid_;
    own_group_ = other.own_group_;
    exit_status_ = other.exit_status_;
    stdin_fd_ = other.stdin_fd_;
    stdout_fd_ = other.stdout_fd_;
    stderr_fd_ = other.stderr_fd_;
    other.pid_ = -1;
    other.stdin_fd_ = other.stdout_fd_ = other.stderr_fd_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  CloseFds();
  if (pid_ > 0 && !exit_status_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    // SIGKILL cannot be caught: this returns once the kernel has ended it.
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

void Subprocess::CloseFds() {
  CloseFd(&stdin_fd_);
  CloseFd(&stdout_fd_);
  CloseFd(&stderr_fd_);
}

void Subprocess::CloseStdin() { CloseFd(&stdin_fd_); }

bool Subprocess::running() {
  if (pid_ <= 0 || exit_status_) return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_status_ = status;
    return false;
  }
  return true;
}

void Subprocess::Signal(int sig) {
  if (running()) ::kill(pid_, sig);
}

void Subprocess::SignalGroup(int sig) {
  // Not reaped yet, so the group id (the child's pid) cannot have been
  // reused, even when the child itself has already exited.
  if (pid_ <= 0 || exit_status_) return;
  ::kill(own_group_ ? -pid_ : pid_, sig);
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no process");
  const absl::Time deadline = absl::Now() + timeout;
  // Short sleeps first: most children Run waits for exit within
  // milliseconds of closing their output.
  absl::Duration nap = absl::Milliseconds(1);
  while (true) {
    if (!running()) return *exit_status_;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(std::min(nap, deadline - now));
    nap = std::min(nap * 2, absl::Milliseconds(10));
  }
}

int Subprocess::Stop(absl::Duration grace) {
  Signal(SIGTERM);
  auto status = Wait(grace);
  if (status.ok()) return *status;
  Signal(SIGKILL);
  auto killed = Wait(absl::Seconds(10));
  return killed.ok() ? *killed : -1;
}

bool RunResult::success() const { return !timed_out && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

namespace {

// Blocks SIGPIPE in this thread for its lifetime and consumes one that a
// write to a closed pipe raised meanwhile (unless one was pending before).
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_only_);
    sigaddset(&pipe_only_, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe_only_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      const timespec zero{0, 0};
      while (::sigtimedwait(&pipe_only_, nullptr, &zero) == SIGPIPE) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_only_, old_;
  bool was_pending_ = false;
};

// Appends what is readable on `fd` to `out`, keeping at most `cap` bytes and
// dropping the rest; false at EOF or on an error.
bool Drain(int fd, std::string* out, bool* truncated, int64_t cap) {
  char buf[8192];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  const int64_t room = cap - static_cast<int64_t>(out->size());
  if (room < n) *truncated = true;
  if (room > 0) out->append(buf, static_cast<size_t>(std::min<int64_t>(room, n)));
  return true;
}

}  // namespace

absl::StatusOr<RunResult> Run(const SubprocessOptions& options, absl::string_view input, absl::Time deadline,
                              int64_t max_output_bytes) {
  if (max_output_bytes < 0) return absl::InvalidArgumentError("max_output_bytes: must be >= 0");
  if (!input.empty() && options.stdin_stream.mode != Stdio::Mode::kPipe) {
    return absl::InvalidArgumentError("input: given, but stdin_stream is not a pipe");
  }
  absl::StatusOr<Subprocess> spawned = Subprocess::Spawn(options);
  if (!spawned.ok()) return spawned.status();
  Subprocess& proc = *spawned;
  RunResult result;
  {
    ScopedSigpipeBlock no_sigpipe;
    if (proc.stdin_fd() >= 0) {
      ::fcntl(proc.stdin_fd(), F_SETFL, ::fcntl(proc.stdin_fd(), F_GETFL) | O_NONBLOCK);
      if (input.empty()) proc.CloseStdin();
    }
    size_t written = 0;
    bool out_open = proc.stdout_fd() >= 0, err_open = proc.stderr_fd() >= 0;
    while (proc.stdin_fd() >= 0 || out_open || err_open) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        result.timed_out = true;
        break;
      }
      pollfd fds[3] = {{proc.stdin_fd(), POLLOUT, 0},
                       {out_open ? proc.stdout_fd() : -1, POLLIN, 0},
                       {err_open ? proc.stderr_fd() : -1, POLLIN, 0}};
      const int ms = static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(left), 1, 1000));
      const int ready = ::poll(fds, 3, ms);
      if (ready < 0 && errno != EINTR) {
        const int err = errno;
        proc.SignalGroup(SIGKILL);
        return absl::InternalError(absl::StrCat("poll: ", std::strerror(err)));
      }
      if (ready <= 0) continue;
      if (fds[0].revents != 0) {
        const ssize_t n = ::write(proc.stdin_fd(), input.data() + written, input.size() - written);
        if (n > 0) written += static_cast<size_t>(n);
        // EPIPE: the child is gone or closed its stdin; the rest is dropped.
        if ((n < 0 && errno != EINTR && errno != EAGAIN) || written == input.size()) proc.CloseStdin();
      }
      if (fds[1].revents != 0) {
        out_open = Drain(proc.stdout_fd(), &result.stdout_text, &result.stdout_truncated, max_output_bytes);
      }
      if (fds[2].revents != 0) {
        err_open = Drain(proc.stderr_fd(), &result.stderr_text, &result.stderr_truncated, max_output_bytes);
      }
    }
    proc.CloseStdin();
  }
  if (!result.timed_out) {
    // Its output is closed: it normally exits at once. One that closed its
    // output and kept running is killed at the deadline like any other.
    absl::StatusOr<int> status = proc.Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (status.ok()) {
      result.wait_status = *status;
      return result;
    }
    result.timed_out = true;
  }
  proc.SignalGroup(SIGKILL);
  absl::StatusOr<int> status = proc.Wait(absl::Seconds(10));
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("argv[0] ", options.argv[0], ": pid ", proc.pid(),
                                            " not reaped 10s after SIGKILL"));
  }
  result.wait_status = *status;
  return result;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return absl::StrCat("status ", status);
}

absl::StatusOr<int> ReadPortFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::ifstream in(path);
    if (in) {
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      int port = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port) && port > 0) return port;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no port in ", path, " after ", absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace rlmesh
