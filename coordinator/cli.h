// What the coordinator's subcommands (coordinator/cmd_*.cc) share: paths a
// user typed, the CLI's RPC client, experiment and cluster YAML loading, the
// flags every role gets, and the services a launched cluster's coordinator
// runs beside its RPCs. The flags are defined in main.cc, beside the usage
// text, and declared here for the commands that read them. Only the
// coordinator binary links this; it is not a library API.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/rpc_client.h"
#include "common/rpc_server.h"
#include "coordinator/cluster.h"
#include "coordinator/dashboard_source.h"
#include "coordinator/experiments.h"
#include "coordinator/hang_watch.h"
#include "coordinator/prometheus.h"
#include "coordinator/registry.h"
#include "coordinator/slurm_launcher.h"
#include "proto/config.pb.h"
#include "proto/coordinator.pb.h"

// Defined in common/server_flags.cc.
ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_root_cert);
ABSL_DECLARE_FLAG(bool, tls_mutual);

// Defined in coordinator/main.cc.
ABSL_DECLARE_FLAG(std::string, cluster);
ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(std::string, run_dir);
ABSL_DECLARE_FLAG(std::vector<std::string>, write_roots);
ABSL_DECLARE_FLAG(std::vector<std::string>, allowed_commands);
ABSL_DECLARE_FLAG(std::string, bin_dir);
ABSL_DECLARE_FLAG(bool, exit_after_health);
ABSL_DECLARE_FLAG(double, timeout_seconds);
ABSL_DECLARE_FLAG(std::string, resume);
ABSL_DECLARE_FLAG(bool, profile);
ABSL_DECLARE_FLAG(double, hang_dump_seconds);
ABSL_DECLARE_FLAG(int, dashboard_port);
ABSL_DECLARE_FLAG(bool, dry_run);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(int, workers);
ABSL_DECLARE_FLAG(double, gpu_memory_gib);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(double, heartbeat_timeout_seconds);
ABSL_DECLARE_FLAG(int, metrics_port);

namespace rlmesh {

// Paths given by a user of `bazel run` are relative to where they typed it.
std::string UserPath(const std::string& p);

// The folder of the role binaries when --bin_dir is not given: the one
// above this binary's.
std::string DefaultBinDir();

// Prints `coordinator <what>: <status>` on stderr and returns 1.
int Fail(const std::string& what, const absl::Status& s);

// The table of roles `status` and a launch print.
void PrintRoles(const std::vector<RoleInfo>& roles);

// The learners' --write_roots flag for a run in `run_dir` (`cfg`: the
// experiment `run` starts; null for `launch`).
std::string LearnerWriteRoots(const std::string& run_dir, const ExperimentConfig* cfg);

// --allowed_commands, resolved against where the user typed the command.
std::vector<std::string> AllowedCommandPrograms();

// The reward servers' --allowed_commands flag (`cfg` as for
// LearnerWriteRoots); empty when no program is allowed.
std::vector<std::string> RewardAllowedCommands(const ExperimentConfig* cfg);

// A client of the coordinator at --address, with --auth_token_file's token
// and --timeout_seconds as its deadline.
absl::StatusOr<RpcClient> CliClient();

// Loads an experiment config with --set overrides applied, its model
// folders and command programs made absolute.
absl::StatusOr<ExperimentConfig> LoadExperiment(const std::string& path, const std::vector<std::string>& sets);

// The addresses of a local cluster's roles, or of a Slurm cluster's.
ClusterAddresses AddressesOf(Cluster& cluster, const std::string& token, const std::string& run_root);
ClusterAddresses AddressesOf(SlurmCluster& cluster, const std::string& token, const std::string& tokenizer,
                             const std::string& run_root);

// Merges the coordinator's and every role's trace under `dir` into `out`.
void WriteProfile(const std::string& dir, const std::string& out);

// Watches for a stuck step and dumps every role's stacks (`seconds`: 0 =
// 900 s, negative = off; null when off).
std::unique_ptr<HangWatch> StartHangWatch(double seconds, const std::string& dir,
                                          std::function<std::optional<ExperimentStatus>()> status,
                                          std::function<std::vector<RoleInfo>()> roles);

// Starts the dashboard when --dashboard_port asks for one (null when off).
absl::StatusOr<std::unique_ptr<DashboardServer>> StartDashboard(
    std::function<std::vector<ExperimentStatus>()> experiments, std::function<std::vector<RoleInfo>()> roles,
    const ClusterAddresses& addresses, const ServerOptions& server, std::unique_ptr<ClusterDashboardSource>* source);

// What a launched cluster's coordinator serves beside its RPCs: Prometheus
// metrics (--metrics_port), the hang watch over the newest experiment
// (--hang_dump_seconds, dumps under <run_dir>/hangs) and the dashboard
// (--dashboard_port). Members stop in reverse order (the dashboard before
// its source); all must go before `experiments` and `roles`' owner.
struct ClusterServices {
  std::unique_ptr<MetricsHttpServer> metrics;
  std::unique_ptr<HangWatch> hang_watch;
  std::unique_ptr<ClusterDashboardSource> dashboard_source;
  std::unique_ptr<DashboardServer> dashboard;
};

absl::Status StartClusterServices(ExperimentManager* experiments, std::function<std::vector<RoleInfo>()> roles,
                                  const ClusterAddresses& addresses, const ServerOptions& server,
                                  const std::string& run_dir, ClusterServices* out);

// "host:port" -> "host".
std::string HostOf(const std::string& address);

RegistryOptions RegistryOptionsFromFlags();

// The --tls_* flags with their paths absolute (bazel run starts in the
// runfiles; the user named files from where they stood), made the
// process's client TLS again.
void NormalizeTlsFlags();

// The TLS flags every role the coordinator starts gets: its own.
std::vector<std::string> RoleTlsArgs();

// A cluster YAML with its paths made absolute; `launcher` must be known.
// Its tls block becomes this process's TLS settings.
absl::StatusOr<ClusterConfig> LoadCluster(const std::string& path);

// The options of a Slurm cluster; `coordinator` is the address this
// coordinator serves at (its host is replaced by slurm.coordinator_address's
// when that is set; its port is kept when that has none).
SlurmOptions SlurmOptionsFor(const ClusterOptions& co, const ClusterConfig& config, const std::string& job_name,
                             const std::string& coordinator);

// --dry-run: the batch script and the steps, nothing submitted.
int PrintDryRun(const SlurmOptions& so);

// The subcommands, one file each (cmd_<name>.cc), and the pieces one
// command borrows from another. Each returns the process's exit code and
// prints its own errors.
int Launch();                                    // cmd_launch.cc
int Serve(Cluster* cluster, int port_override);  // cmd_serve.cc; `launch` of a local cluster
int Submit(const std::vector<std::string>& args, const std::vector<std::string>& sets);
int Status(const std::vector<std::string>& args);
int List();
int Cancel(const std::vector<std::string>& args);
// `eval_folder`: evaluate that folder instead of running the stages
// (`coordinator eval`).
int Run(const std::vector<std::string>& args, const std::vector<std::string>& sets,
        const std::string& eval_folder = "");
int Eval(const std::vector<std::string>& args, std::vector<std::string> sets);
int Plan(const std::vector<std::string>& args, const std::vector<std::string>& sets);
int K8s();

// `coordinator plan` and `run --dry-run` of a local run (cmd_plan.cc): the
// memory plan, and 1 when it does not fit.
int PrintPlan(const char* command, const ExperimentConfig& cfg);

// `k8s` and `launch --dry-run` of a kubernetes cluster (cmd_k8s.cc): the
// manifests on stdout, or one file per object under --out.
int RenderK8s(const std::string& what, const ClusterConfig& config);

}  // namespace rlmesh
