#pragma once

// The one way this codebase starts a child process. Subprocess::Spawn starts
// one from a SubprocessOptions (argv, environment, cwd, where each standard
// stream goes, process group, death with the parent, a pre-exec hook) and
// hands back a handle; Run() takes a child to its end under a deadline,
// feeding its stdin and keeping a bounded amount of its stdout and stderr.
// The coordinator launches roles with Start, the Slurm launcher runs sbatch
// and squeue with Run, command verifiers and the sandbox run their programs
// with Run, and tests start real binaries with Start.
//
// The destructor of a handle kills (SIGKILL) and reaps a child that is still
// running, so nothing outlives its owner by accident.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rlmesh {

// Where one of a child's standard streams goes.
struct Stdio {
  enum class Mode {
    kInherit,  // this process's own stream
    kDevNull,  // /dev/null
    kFile,     // `path`: read for stdin; created and appended to for output
    kPipe,     // a pipe whose other end the handle owns (stdin_fd() etc.)
  };
  Mode mode = Mode::kInherit;
  // The file for kFile; unused otherwise.
  std::string path;

  static Stdio Inherit() { return {}; }
  static Stdio DevNull() { return {Mode::kDevNull, ""}; }
  static Stdio File(std::string path) { return {Mode::kFile, std::move(path)}; }
  static Stdio Pipe() { return {Mode::kPipe, ""}; }
};

// Runs in the child between fork and exec, after its streams, process group,
// signal mask and cwd are set and (with close_other_fds) the other
// descriptors closed. It must call only async-signal-safe functions and must
// not allocate or take locks: whatever it needs is prepared before Spawn and
// reached through `arg`. It returns 0 to go on to exec, or an exit code
// (1..255) that the child exits with instead.
using ChildHook = int (*)(const void* arg);

struct SubprocessOptions {
  // The program and its arguments. argv[0] is a path (with a '/') or a name
  // looked up on this process's $PATH. Required.
  std::vector<std::string> argv;
  // "NAME=VALUE" entries that replace or add to the environment.
  std::vector<std::string> env;
  // Start from this process's environment (true) or from nothing but `env`
  // (false). Default true.
  bool inherit_env = true;
  // Directory the child runs in; empty = this process's. Default empty.
  std::string cwd;
  // The child's standard streams. Default: all inherited.
  Stdio stdin_stream;
  Stdio stdout_stream;
  Stdio stderr_stream;
  // When non-empty, stdout and stderr both go to this file (created,
  // appended to); stdout_stream and stderr_stream must then be kInherit.
  std::string log_path;
  // The child leads a process group of its own (a terminal's Ctrl-C reaches
  // only this process; Run kills the whole group at its deadline). Default
  // true.
  bool own_process_group = true;
  // The child gets SIGKILL when the thread that started it ends
  // (PR_SET_PDEATHSIG), and does not start at all when this process died
  // while it was being set up. Default true.
  bool die_with_parent = true;
  // Every descriptor above 2 is closed in the child, not only those marked
  // close-on-exec. Default false.
  bool close_other_fds = false;
  // See ChildHook; nullptr = none. `child_hook_arg` is passed to it as is.
  ChildHook child_hook = nullptr;
  const void* child_hook_arg = nullptr;

  // INVALID_ARGUMENT naming the field: empty argv or argv[0], an env entry
  // that is not NAME=VALUE, kFile without a path, log_path with
  // stdout_stream or stderr_stream set.
  absl::Status Validate() const;
};

// Not thread-safe; owned by one thread.
class Subprocess {
 public:
  // Starts a child as `options` say. The child starts with no signal
  // blocked and SIGPIPE at its default. Returns once the child has exec'd,
  // so that a child that cannot start is an error here, not an exit code:
  //   INVALID_ARGUMENT  options.Validate() failed;
  //   NOT_FOUND         argv[0] not on $PATH or not an executable, cwd or a
  //                     stdin file missing;
  //   PERMISSION_DENIED a file or cwd not accessible;
  //   FAILED_PRECONDITION execve failed otherwise (e.g. not a program);
  //   RESOURCE_EXHAUSTED / INTERNAL  pipe or fork failed.
  // Each error names argv[0], the cwd or the file it is about.
  static absl::StatusOr<Subprocess> Spawn(const SubprocessOptions& options);

  // Spawn with `argv`, stdout and stderr appended to `log_path` when
  // non-empty (else inherited), and `env` added to the environment.
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::string& log_path = "",
                                          const std::vector<std::string>& env = {});

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool running();

  // This process's ends of the kPipe streams (write end for stdin), else -1.
  // Owned by the handle; closed by the destructor.
  int stdin_fd() const { return stdin_fd_; }
  int stdout_fd() const { return stdout_fd_; }
  int stderr_fd() const { return stderr_fd_; }
  // Closes the stdin pipe (the child reads EOF). No-op without one.
  void CloseStdin();

  // Sends a signal to the child. No-op once reaped.
  void Signal(int sig);
  // Sends a signal to the child's process group when it leads one, else to
  // the child. No-op once reaped (the group id could name another group).
  void SignalGroup(int sig);

  // Waits up to `timeout` for exit; returns the raw wait status, or
  // DEADLINE_EXCEEDED if still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // SIGTERM, wait up to `grace`, then SIGKILL; returns the wait status.
  int Stop(absl::Duration grace);

 private:
  Subprocess(pid_t pid, bool own_group) : pid_(pid), own_group_(own_group) {}
  void CloseFds();

  pid_t pid_ = -1;
  bool own_group_ = false;
  std::optional<int> exit_status_;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
};

// How a child run by Run() ended and what it printed.
struct RunResult {
  // Raw wait status (see DescribeWaitStatus).
  int wait_status = 0;
  // The deadline passed first; the child's process group was SIGKILLed.
  bool timed_out = false;
  // What the child wrote to its kPipe stdout / stderr, at most
  // max_output_bytes each; the rest was read and dropped.
  std::string stdout_text;
  std::string stderr_text;
  bool stdout_truncated = false;
  bool stderr_truncated = false;

  // Exited with code 0.
  bool success() const;
};

// Spawns `options`, writes `input` to its stdin pipe (then closes it), keeps
// up to `max_output_bytes` of each piped output stream, and waits for the
// child to exit. At `deadline` the child's process group (the child alone
// without own_process_group) is SIGKILLed and timed_out set. The child is
// always reaped before Run returns. A child that exits without reading its
// input does not kill this process (SIGPIPE is blocked in this thread while
// writing, and consumed). A grandchild that keeps an output pipe open keeps
// Run waiting until the deadline.
// Spawn's errors; INVALID_ARGUMENT when `input` is non-empty and stdin is
// not kPipe, or max_output_bytes < 0.
absl::StatusOr<RunResult> Run(const SubprocessOptions& options, absl::string_view input, absl::Time deadline,
                              int64_t max_output_bytes = int64_t{1} << 20);

// "exit 0", "exit 3", "signal 9" for a wait status.
std::string DescribeWaitStatus(int status);

// Polls `path` until it holds a port number or `timeout` passes.
absl::StatusOr<int> ReadPortFile(const std::string& path, absl::Duration timeout);

}  // namespace rlmesh
