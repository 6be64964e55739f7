// coordinator: the one binary a user needs. Starts a local cluster, serves
// the Coordinator RPC, and talks to a running one.
//
// This file holds every flag (so `--helpfull` lists them in one place and
// each says which commands read it), the usage text and the dispatch; each
// subcommand is its own cmd_<name>.cc, and what they share is cli.h.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/server_flags.h"
#include "coordinator/cli.h"

ABSL_FLAG(std::string, cluster, "",
          "launch: cluster YAML (ClusterConfig). run: a cluster with launcher: slurm to run the roles on.");
ABSL_FLAG(std::string, address, "127.0.0.1:7401",
          "status/list/cancel/submit: address of a running coordinator.");
ABSL_FLAG(std::string, run_dir, "", "launch: run directory (default runs/<cluster name>).");
ABSL_FLAG(std::vector<std::string>, write_roots, {},
          "launch/run: folders besides the run's own that the learners may write into (for a reward model's "
          "output elsewhere); comma-separated.");
ABSL_FLAG(std::vector<std::string>, allowed_commands, {},
          "launch/run: programs the reward servers may run as `command` verifiers (comma-separated paths); "
          "`run` adds the experiment's own. A submitted experiment naming another program fails with "
          "PERMISSION_DENIED.");
ABSL_FLAG(std::string, bin_dir, "",
          "launch: folder with the role binaries (default: next to this binary).");
ABSL_FLAG(bool, exit_after_health, false,
          "launch: print every role's health, then stop the cluster and exit "
          "(0 if all roles serve).");
ABSL_FLAG(double, timeout_seconds, 10.0, "Deadline of each RPC the CLI makes.");
ABSL_FLAG(std::string, resume, "",
          "run: continue the run in this run directory (its saved experiment config is used; "
          "finished stages are skipped, the current one resumes from its newest checkpoint).");
ABSL_FLAG(bool, profile, false,
          "run: record a Chrome trace-event profile of every role (phases, generate, score, train "
          "forward/backward/optimizer, buffer calls) and merge them into <run dir>/profile.json, "
          "one time axis (open it in Perfetto or chrome://tracing).");
ABSL_FLAG(double, hang_dump_seconds, 0,
          "launch: a step phase that lasts longer than this dumps every role's thread stacks (gdb) "
          "under <run dir>/hangs/ (0 = 900 s, negative = off). `run` reads logging.hang_dump_seconds.");
ABSL_FLAG(int, dashboard_port, -1,
          "launch/run: serve the web dashboard on this port (0 = a free one, -1 = off), on the "
          "coordinator's --bind interface (loopback by default), with the cluster's token.");
ABSL_FLAG(bool, dry_run, false,
          "launch/run with a Slurm cluster (--cluster, launcher: slurm): print the sbatch script "
          "and the srun step of every role, then exit without submitting; launch with a "
          "kubernetes cluster: print its manifests (as `coordinator k8s`). Also --dry-run.");
ABSL_FLAG(std::string, out, "",
          "k8s: write one file per object into this folder (for `kubectl apply -f DIR`) instead of "
          "printing one multi-document YAML to stdout. eval: the per-sample JSONL (default "
          "<run dir>/eval_samples.jsonl).");
ABSL_FLAG(std::string, model, "",
          "eval: the model folder to evaluate (a Hugging Face folder or a run's checkpoint); sets "
          "model.init=checkpoint and model.path.");
ABSL_FLAG(std::string, data, "", "eval: the held-out JSONL (sets task.eval_path; default: the experiment's).");
ABSL_FLAG(int, workers, 0, "eval: rollout workers (sets rollout.workers; default: the experiment's).");
ABSL_FLAG(double, gpu_memory_gib, 0,
          "plan, run --dry-run: memory of each GPU in GiB, to check the GPU roles against (0 = unknown: they are "
          "planned, not checked).");
ABSL_FLAG(bool, json, false, "plan: print the plan as JSON.");
ABSL_FLAG(double, heartbeat_timeout_seconds, 5.0,
          "A registered role without a heartbeat for this long is shown DEAD.");
ABSL_FLAG(int, metrics_port, -1,
          "launch: serve Prometheus /metrics on this port (0 = a free one, -1 = off). "
          "run uses the experiment's logging.prometheus_port.");

namespace rlmesh {
namespace {

constexpr char kUsage[] = R"(usage: coordinator <command> [flags]

commands:
  launch --cluster CLUSTER.yaml   start the roles (child processes, or Slurm steps with
                                  launcher: slurm) and serve the Coordinator RPC
  serve                           serve the Coordinator RPC without launching roles
  submit EXPERIMENT.yaml          validate an experiment config and submit it; prints its id
  status [ID]                     experiment progress and the health of every role
  list                            experiments known to the coordinator
  cancel ID                       cancel an experiment
  run EXPERIMENT.yaml             launch + submit + follow + clean shutdown
                                  (--cluster SLURM.yaml runs the roles as Slurm steps;
                                  --dry-run prints the batch script)
  plan EXPERIMENT.yaml [--gpu_memory_gib G] [--json]
                                  the memory each role needs (weights, gradients, optimizer,
                                  activations, KV cache) against its device's; exits 1
                                  naming the roles when it does not fit (also run --dry-run)
  eval EXPERIMENT.yaml --model DIR [--data FILE] [--workers N] [--out FILE]
                                  evaluate a model folder with the experiment's task,
                                  chat template and verifiers: greedy accuracy, pass@k
                                  (eval.pass_at), every sample written as JSONL
  k8s --cluster K8S.yaml [--out DIR]
                                  render the Kubernetes manifests of a cluster with
                                  launcher: kubernetes (`launch --dry-run` prints them too;
                                  `launch` inside the coordinator's pod waits for the roles)

common flags: --address=HOST:PORT (client commands), --auth_token_file=FILE,
  --port, --port_file, --bind, --tls_cert/--tls_key (server commands),
  --set key.path=value (submit/run, repeatable). `coordinator --helpfull` lists every flag.
)";

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  using namespace rlmesh;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  // The roles share the host's cores (and in async mode run at once):
  // OpenMP threads that spin while another process holds the cores made a
  // training step 2-5x slower with 5-10x spread (bench/learner.md). Roles
  // inherit this unless the user set it. A short spin still bridges the
  // microsecond gaps between one process's ops (PASSIVE's 0 made a short
  // run 35% slower alone), but it must stay short: at 100000 (~1 ms) two
  // runs sharing 2 cores took 13x as long as one, at 10000 5x, at 1000
  // 2.1x, no slower alone than 100000 (docs/design/cpu.md).
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
  ::setenv("GOMP_SPINCOUNT", "1000", /*overwrite=*/0);
  // --set may repeat; absl keeps only the last value of a flag, so take them
  // out before parsing.
  std::vector<std::string> sets;
  std::vector<char*> rest = {argv[0]};
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dry-run") == 0) {
      rest.push_back(const_cast<char*>("--dry_run"));
    } else if (std::strncmp(argv[i], "--set=", 6) == 0) {
      sets.push_back(argv[i] + 6);
    } else if (std::strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
      sets.push_back(argv[++i]);
    } else {
      rest.push_back(argv[i]);
    }
  }
  auto positional = InitServerProcess(static_cast<int>(rest.size()), rest.data(), "coordinator", kUsage);
  NormalizeTlsFlags();
  std::vector<std::string> args(positional.begin() + 1, positional.end());

  if (command == "launch") return Launch();
  if (command == "serve") return Serve(nullptr, 0);
  if (command == "status") return Status(args);
  if (command == "list") return List();
  if (command == "cancel") return Cancel(args);
  if (command == "submit") return Submit(args, sets);
  if (command == "run") return Run(args, sets);
  if (command == "eval") return Eval(args, sets);
  if (command == "plan") return Plan(args, sets);
  if (command == "k8s") return K8s();
  std::fprintf(stderr, "coordinator: unknown command '%s'\n%s", command.c_str(), kUsage);
  return 2;
}
