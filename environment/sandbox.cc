#include "environment/sandbox.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"

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

// The child hook (arg: the SandboxLimits), after the common setup (own
// process group, no signal blocked, stdio on pipes, every other descriptor
// closed, empty environment) and before exec: async-signal-safe calls only.
int ConfineChild(const void* arg) {
  const SandboxLimits& limits = *static_cast<const SandboxLimits*>(arg);
  // A namespace first (it may need a process count the limits forbid).
  const bool isolated = ::unshare(CLONE_NEWNET) == 0 || ::unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0;
  // A write past RLIMIT_FSIZE fails (EFBIG) instead of killing the child
  // with SIGXFSZ.
  ::signal(SIGXFSZ, SIG_IGN);
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
  if (!isolated && !filtered && limits.require_network_isolation) return kNoNetworkExit;
  return 0;
}

// The child hook of NetworkIsolationWorks: 0 (go on to exec) when the child
// could be cut off the network, else 1.
int ProbeIsolation(const void*) {
  const bool ns = ::unshare(CLONE_NEWNET) == 0 || ::unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0;
  return ns || InstallFilter() ? 0 : 1;
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
  SubprocessOptions o;
  o.argv = argv;
  o.inherit_env = false;
  o.stdin_stream = Stdio::Pipe();
  o.stdout_stream = Stdio::Pipe();
  o.stderr_stream = Stdio::Pipe();
  o.own_process_group = true;  // killed whole at the deadline
  o.close_other_fds = true;    // listening sockets, files
  o.child_hook = ConfineChild;
  o.child_hook_arg = &limits;
  absl::StatusOr<RunResult> run = Run(o, input, absl::Now() + limits.wall_timeout, limits.max_output_bytes);
  SandboxResult result;
  if (!run.ok()) {
    switch (run.status().code()) {
      case absl::StatusCode::kNotFound:
      case absl::StatusCode::kPermissionDenied:
      case absl::StatusCode::kFailedPrecondition:
        // The evaluator could not be exec'd: a result, as if it had run.
        result.exit_code = kExecFailedExit;
        return result;
      default:
        return absl::InternalError(run.status().message());
    }
  }
  result.timed_out = run->timed_out;
  result.stdout_text = std::move(run->stdout_text);
  result.stderr_text = std::move(run->stderr_text);
  if (WIFEXITED(run->wait_status)) result.exit_code = WEXITSTATUS(run->wait_status);
  if (WIFSIGNALED(run->wait_status)) result.signal = WTERMSIG(run->wait_status);
  return result;
}

bool NetworkIsolationWorks() {
  SubprocessOptions o;
  o.argv = {"/bin/true"};
  o.inherit_env = false;
  o.stdin_stream = Stdio::DevNull();
  o.child_hook = ProbeIsolation;
  absl::StatusOr<RunResult> run = Run(o, "", absl::Now() + absl::Seconds(10));
  return run.ok() && run->success();
}

}  // namespace rlmesh::environment
