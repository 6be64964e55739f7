#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"

namespace rlmesh {

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv,
                                             const std::string& log_path,
                                             const std::vector<std::string>& env) {
  if (argv.empty()) return absl::InvalidArgumentError("argv: empty");
  for (const std::string& kv : env) {
    if (kv.find('=') == std::string::npos || kv.front() == '=') {
      return absl::InvalidArgumentError(absl::StrCat("env: \"", kv, "\" is not NAME=VALUE"));
    }
  }
  if (::access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("not an executable: ", argv[0]));
  }
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot open log ", log_path, ": ", std::strerror(errno)));
    }
  }
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  // The child's environment: this process's, with `env` replacing (or
  // adding) its names. Built before fork: the child only calls execve.
  std::vector<std::string> child_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const std::string name = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const std::string& o : env) replaced = replaced || o.compare(0, name.size() + 1, name + "=") == 0;
    if (!replaced) child_env.push_back(kv);
  }
  for (const std::string& o : env) child_env.push_back(o);
  std::vector<char*> cenv;
  for (const auto& kv : child_env) cenv.push_back(const_cast<char*>(kv.c_str()));
  cenv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    if (log_fd >= 0) ::close(log_fd);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    // A process group of its own: a terminal's Ctrl-C reaches only the
    // parent, which stops its children in order (and does not mistake them
    // for crashed roles).
    ::setpgid(0, 0);
    sigset_t set;
    sigemptyset(&set);
    ::sigprocmask(SIG_SETMASK, &set, nullptr);
    if (log_fd >= 0) {
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
    }
    ::execve(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  return Subprocess(pid);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), exit_status_(other.exit_status_) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !exit_status_) Stop(absl::ZeroDuration());
    pid_ = other.pid_;
    exit_status_ = other.exit_status_;
    other.pid_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_status_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

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

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no process");
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (!running()) return *exit_status_;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
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
