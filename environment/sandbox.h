#pragma once

// Runs an untrusted computation (the calculator's evaluator) as a child
// process under resource limits and hands back what it printed:
//   - RLIMIT_CPU: CPU seconds, then SIGKILL (an infinite loop);
//   - RLIMIT_AS: address space (a huge allocation fails inside the child);
//   - RLIMIT_FSIZE 0 (no bytes written to files; creating an empty file is
//     not prevented), RLIMIT_CORE 0, RLIMIT_NOFILE 8, RLIMIT_NPROC 0 (not
//     enforced by the kernel for root), an empty environment, every other
//     fd closed, a process group of its own (killed whole at the deadline);
//   - a seccomp filter: clone/fork/vfork, socket/socketpair and ptrace fail
//     with EPERM (no processes, threads or network, also as root);
//   - no network, besides: unshare(CLONE_NEWNET) (privileged) or
//     unshare(CLONE_NEWUSER | CLONE_NEWNET) put it in an empty network
//     namespace where the kernel allows;
//   - a wall-clock deadline after which the parent SIGKILLs the child (a
//     child blocked without using CPU).
// NetworkIsolationWorks() says whether the namespace or the filter can be
// had here (the server logs it at start); `require_network_isolation`
// refuses to run without either.
// The child cannot hurt the caller: whatever it does comes back as a
// SandboxResult. Thread-safe (pipes are O_CLOEXEC, so concurrent runs do
// not leak descriptors into each other's children). A child that exits
// without reading its input does not kill the caller: the child is run by
// common/subprocess.h's Run, which blocks SIGPIPE in the calling thread
// while it writes.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace rlmesh::environment {

struct SandboxLimits {
  // CPU time of the child, seconds (RLIMIT_CPU). Default 1.
  int cpu_seconds = 1;
  // Address space of the child, bytes (RLIMIT_AS). Default 256 MiB.
  int64_t address_space_bytes = int64_t{256} << 20;
  // Wall-clock limit; the child is killed after it. Default 3 s.
  absl::Duration wall_timeout = absl::Seconds(3);
  // Output kept per stream, bytes; the rest is read and dropped. Default 4096.
  int64_t max_output_bytes = 4096;
  // Fail (the child exits 126 before running anything) when neither a
  // network namespace nor the seccomp filter can be had. Default false:
  // best effort, see the file comment.
  bool require_network_isolation = false;

  absl::Status Validate() const;
};

struct SandboxResult {
  // Exit code when the child exited, else -1.
  int exit_code = -1;
  // Signal that ended the child, else 0 (SIGKILL/SIGXCPU: a limit).
  int signal = 0;
  // The parent killed it at wall_timeout.
  bool timed_out = false;
  std::string stdout_text;
  std::string stderr_text;

  bool ok() const { return exit_code == 0; }
  // One line for people: "exit 1", "killed: CPU time limit", ...
  std::string Describe() const;
};

// Runs argv (argv[0] an absolute path) with `input` on its stdin.
// INVALID_ARGUMENT for an empty argv or bad limits; INTERNAL when fork or a
// pipe fails. How the child ended is in the result, never an error.
absl::StatusOr<SandboxResult> RunSandboxed(const std::vector<std::string>& argv, const std::string& input,
                                           const SandboxLimits& limits);

// Whether a child of this process can be cut off the network (a namespace
// of its own or the seccomp filter).
bool NetworkIsolationWorks();

}  // namespace rlmesh::environment
