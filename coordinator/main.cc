// coordinator: the one binary a user needs. Starts a local cluster, serves
// the Coordinator RPC, and talks to a running one.
//
// Over 600 lines because it is every subcommand's wiring (flags → options →
// the parts in this folder, which hold the logic): launch and run on the
// local and the Slurm launcher, launch in a Kubernetes pod and the k8s
// manifests, submit/status/list/cancel. Splitting it
// would scatter the flag definitions that each command reads.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/path_root.h"
#include "common/proto_yaml.h"
#include "common/rpc_client.h"
#include "common/server_flags.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "actor/model_config.h"
#include "actor/tokenizer.h"
#include "coordinator/cluster.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/dashboard_source.h"
#include "coordinator/hang_watch.h"
#include "coordinator/k8s_manifests.h"
#include "coordinator/memory_plan.h"
#include "coordinator/model_defaults.h"
#include "coordinator/experiment_config.h"
#include "coordinator/experiments.h"
#include "coordinator/prometheus.h"
#include "coordinator/registry.h"
#include "coordinator/runner.h"
#include "coordinator/slurm_launcher.h"
#include "tasks/encoding.h"
#include "tasks/task.h"
#include "proto/config.pb.h"
#include "proto/coordinator.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, auth_token_file);
ABSL_DECLARE_FLAG(int, port);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_root_cert);
ABSL_DECLARE_FLAG(bool, tls_mutual);

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

// Paths given by a user of `bazel run` are relative to where they typed it.
std::string UserPath(const std::string& p) {
  if (p.empty() || p[0] == '/') return p;
  const char* wd = std::getenv("BUILD_WORKING_DIRECTORY");
  return wd ? absl::StrCat(wd, "/", p) : p;
}

std::string DefaultBinDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().parent_path().string();
}

const char* RoleName(Role r) {
  switch (r) {
    case ROLE_COORDINATOR: return "coordinator";
    case ROLE_ROLLOUT_WORKER: return "rollout_worker";
    case ROLE_REWARD_SERVER: return "reward_server";
    case ROLE_REPLAY_BUFFER: return "replay_buffer";
    case ROLE_LEARNER: return "learner";
    case ROLE_ENVIRONMENT: return "environment";
    default: return "?";
  }
}

void PrintRoles(const std::vector<RoleInfo>& roles) {
  std::printf("%-16s %-15s %-16s %-22s %-8s %-12s %-9s %s\n", "NAME", "ROLE", "HOST", "ADDRESS", "PID", "HEALTH",
              "RESTARTS", "LAST_HEARTBEAT");
  const int64_t now = absl::ToUnixMicros(absl::Now());
  for (const auto& r : roles) {
    const std::string beat = r.last_heartbeat_unix_micros() > 0
                                 ? absl::StrFormat("%.1fs ago", (now - r.last_heartbeat_unix_micros()) / 1e6)
                                 : "-";
    std::printf("%-16s %-15s %-16s %-22s %-8lld %-12s %-9d %s\n", r.name().c_str(), RoleName(r.role()),
                r.host().empty() ? "-" : r.host().c_str(), r.address().c_str(), static_cast<long long>(r.pid()),
                r.health().c_str(), r.restarts(), beat.c_str());
  }
  std::fflush(stdout);
}

// The learners' --write_roots: the run's folder, the reward-model outputs
// of `cfg` (the experiment `run` starts; null for `launch`) and
// --write_roots, each resolved against this working directory (which the
// roles share). Checkpoints and weight folders live in the run's folder.
std::string LearnerWriteRoots(const std::string& run_dir, const ExperimentConfig* cfg) {
  std::vector<std::string> roots = {ResolvePath(run_dir)};
  if (cfg != nullptr) {
    for (const Stage& stage : cfg->stages()) {
      if (!stage.reward_model().output().empty()) roots.push_back(ResolvePath(stage.reward_model().output()));
    }
  }
  for (const std::string& r : absl::GetFlag(FLAGS_write_roots)) roots.push_back(ResolvePath(r));
  return "--write_roots=" + absl::StrJoin(roots, ",");
}

// The reward servers' --allowed_commands: the programs of `cfg`'s command
// verifiers (the experiment `run` starts; null for `launch`, whose
// experiments arrive later) and --allowed_commands, resolved against this
// working directory. Empty when there are none (the servers then run no
// program a request names).
// --allowed_commands, resolved against where the user typed the command.
std::vector<std::string> AllowedCommandPrograms() {
  std::vector<std::string> programs;
  for (const std::string& p : absl::GetFlag(FLAGS_allowed_commands)) programs.push_back(ResolvePath(UserPath(p)));
  return programs;
}

std::vector<std::string> RewardAllowedCommands(const ExperimentConfig* cfg) {
  std::vector<std::string> programs;
  if (cfg != nullptr) {
    for (const VerifierConfig& v : cfg->reward().verifiers()) {
      if (v.name() == "command" && !v.command().empty()) programs.push_back(ResolvePath(v.command(0)));
    }
  }
  for (std::string& p : AllowedCommandPrograms()) programs.push_back(std::move(p));
  if (programs.empty()) return {};
  return {"--allowed_commands=" + absl::StrJoin(programs, ",")};
}

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "coordinator %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

absl::StatusOr<RpcClient> CliClient() {
  ClientOptions o;
  auto token = ReadTokenFile(absl::GetFlag(FLAGS_auth_token_file));
  if (!token.ok()) return token.status();
  o.auth_token = *token;
  o.default_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds));
  return RpcClient::Create(absl::GetFlag(FLAGS_address), o);
}

// Loads an experiment config with --set overrides applied.
absl::StatusOr<ExperimentConfig> LoadExperiment(const std::string& path,
                                                const std::vector<std::string>& sets) {
  ExperimentConfig cfg;
  YamlSource src;
  RLMESH_RETURN_IF_ERROR(LoadYamlFile(UserPath(path), &cfg, &src));
  for (const auto& s : sets) RLMESH_RETURN_IF_ERROR(ApplyOverride(s, &cfg, &src));
  // Model folders (the initial model, distillation teachers) are made by
  // earlier runs or downloaded, never part of the build: a relative one
  // means where the user typed the command, and the roles, which run
  // elsewhere, get it absolute.
  auto absolute = [](const std::string& p) {
    return p.empty() ? p : std::filesystem::absolute(UserPath(p)).lexically_normal().string();
  };
  if (!cfg.model().path().empty()) cfg.mutable_model()->set_path(absolute(cfg.model().path()));
  // A Hub folder brings its tokenizer and sampling defaults; say which.
  std::vector<std::string> notes;
  RLMESH_RETURN_IF_ERROR(ApplyModelFolderDefaults(&cfg, cfg.model().path(), &notes));
  for (const std::string& note : notes) std::printf("rlmesh: %s\n", note.c_str());
  RLMESH_RETURN_IF_ERROR(NormalizeExperiment(&cfg, src));
  // A command verifier's program likewise: the reward server resolves it
  // against its own working directory, and allows it by that name.
  for (VerifierConfig& v : *cfg.mutable_reward()->mutable_verifiers()) {
    if (v.name() == "command" && !v.command().empty()) v.set_command(0, absolute(v.command(0)));
  }
  for (Stage& stage : *cfg.mutable_stages()) {
    RlStage* rl = stage.has_grpo() ? stage.mutable_grpo()->mutable_rl()
                                   : (stage.has_ppo() ? stage.mutable_ppo()->mutable_rl() : nullptr);
    if (rl != nullptr && !rl->distillation().teacher().empty()) {
      rl->mutable_distillation()->set_teacher(absolute(rl->distillation().teacher()));
    }
  }
  return cfg;
}

ClusterAddresses AddressesOf(Cluster& cluster, const std::string& token, const std::string& run_root) {
  ClusterAddresses a;
  a.replay_buffer = cluster.Address(ROLE_REPLAY_BUFFER);
  a.reward_servers = cluster.Addresses(ROLE_REWARD_SERVER);
  a.rollout_workers = cluster.Addresses(ROLE_ROLLOUT_WORKER);
  a.learners = cluster.Addresses(ROLE_LEARNER);
  a.auth_token = token;
  a.tokenizer = cluster.options().tokenizer;
  a.run_root = run_root;
  return a;
}

// Merges the coordinator's and every role's trace into one file. A role
// killed (not stopped) leaves no trace: the profile says which are there.
void WriteProfile(const std::string& dir, const std::string& out) {
  FinishTrace("coordinator");
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  auto events = MergeTraces(files, out);
  if (!events.ok()) {
    std::fprintf(stderr, "rlmesh: profile not written: %s\n", events.status().ToString().c_str());
    return;
  }
  std::printf("rlmesh: profile of %zu processes (%lld spans) in %s\n", files.size(),
              static_cast<long long>(*events), out.c_str());
}

// Watches for a stuck step and dumps every role's stacks (logging.
// hang_dump_seconds: 0 = 900 s, negative = off; null when off).
std::unique_ptr<HangWatch> StartHangWatch(double seconds, const std::string& dir,
                                          std::function<std::optional<ExperimentStatus>()> status,
                                          std::function<std::vector<RoleInfo>()> roles) {
  if (seconds < 0) return nullptr;
  HangWatchOptions o;
  o.after = absl::Seconds(seconds == 0 ? 900 : seconds);
  o.dump_dir = dir;
  return std::make_unique<HangWatch>(o, std::move(status), std::move(roles));
}

// Starts the dashboard when --dashboard_port asks for one (null when off).
absl::StatusOr<std::unique_ptr<DashboardServer>> StartDashboard(
    std::function<std::vector<ExperimentStatus>()> experiments, std::function<std::vector<RoleInfo>()> roles,
    const ClusterAddresses& addresses, const ServerOptions& server, std::unique_ptr<ClusterDashboardSource>* source) {
  const int port = absl::GetFlag(FLAGS_dashboard_port);
  if (port < 0) return std::unique_ptr<DashboardServer>();
  RLMESH_ASSIGN_OR_RETURN(*source, ClusterDashboardSource::Create(std::move(experiments), std::move(roles),
                                                                  addresses.replay_buffer, addresses.auth_token,
                                                                  addresses.tokenizer));
  DashboardOptions o;
  o.host = server.bind_address;
  o.port = port;
  o.auth_token = server.auth_token;
  RLMESH_ASSIGN_OR_RETURN(auto dashboard, DashboardServer::Start(o, source->get()));
  std::printf("rlmesh: dashboard on http://%s:%d/%s\n", o.host.c_str(), dashboard->port(),
              o.auth_token.empty() ? "" : "?token=<the cluster's token>");
  std::fflush(stdout);
  return dashboard;
}

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
                                  const std::string& run_dir, ClusterServices* out) {
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    RLMESH_ASSIGN_OR_RETURN(out->metrics, MetricsHttpServer::Start(server.bind_address, absl::GetFlag(FLAGS_metrics_port),
                                                                  [experiments] { return experiments->List(); }));
    std::printf("rlmesh: metrics on http://%s:%d/metrics\n", server.bind_address.c_str(), out->metrics->port());
  }
  out->hang_watch = StartHangWatch(absl::GetFlag(FLAGS_hang_dump_seconds), run_dir + "/hangs",
                                   [experiments]() -> std::optional<ExperimentStatus> {
                                     auto s = experiments->Newest();
                                     if (!s.ok()) return std::nullopt;
                                     return *s;
                                   },
                                   roles);
  RLMESH_ASSIGN_OR_RETURN(out->dashboard, StartDashboard([experiments] { return experiments->List(); }, roles,
                                                         addresses, server, &out->dashboard_source));
  return absl::OkStatus();
}

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

ClusterAddresses AddressesOf(SlurmCluster& cluster, const std::string& token, const std::string& tokenizer,
                             const std::string& run_root) {
  ClusterAddresses a;
  a.replay_buffer = cluster.Addresses(ROLE_REPLAY_BUFFER).at(0);
  a.reward_servers = cluster.Addresses(ROLE_REWARD_SERVER);
  a.rollout_workers = cluster.Addresses(ROLE_ROLLOUT_WORKER);
  a.learners = cluster.Addresses(ROLE_LEARNER);
  a.auth_token = token;
  a.tokenizer = tokenizer;
  a.run_root = run_root;
  // Learner 0 hosts the weight-sync store; the workers reach it where it
  // registered.
  if (!a.learners.empty()) a.sync_store_host = HostOf(a.learners[0]);
  return a;
}

RegistryOptions RegistryOptionsFromFlags() {
  RegistryOptions o;
  o.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_seconds));
  return o;
}

// The --tls_* flags with their paths absolute (bazel run starts in the
// runfiles; the user named files from where they stood), made the
// process's client TLS again.
void NormalizeTlsFlags() {
  for (auto* flag : {&FLAGS_tls_cert, &FLAGS_tls_key, &FLAGS_tls_root_cert}) {
    if (!absl::GetFlag(*flag).empty()) absl::SetFlag(flag, UserPath(absl::GetFlag(*flag)));
  }
  SetProcessClientTls(ClientTlsFromFlags());
}

// A cluster's tls block: fills the --tls_* flags the command line left
// empty (so the coordinator's server and clients use it), errors naming the
// field.
absl::Status ApplyClusterTls(const TlsConfig& tls) {
  if (tls.cert_file().empty() != tls.key_file().empty()) {
    return absl::InvalidArgumentError("tls.cert_file and tls.key_file: set both or neither");
  }
  if (tls.mutual() && (tls.cert_file().empty() || tls.root_cert_file().empty())) {
    return absl::InvalidArgumentError("tls.mutual: needs tls.cert_file, tls.key_file and tls.root_cert_file");
  }
  auto fill = [](absl::Flag<std::string>* flag, const std::string& field, const std::string& value) -> absl::Status {
    if (value.empty() || !absl::GetFlag(*flag).empty()) return absl::OkStatus();
    const std::string path = UserPath(value);
    if (::access(path.c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("tls.", field, ": cannot read ", path));
    }
    absl::SetFlag(flag, path);
    return absl::OkStatus();
  };
  RLMESH_RETURN_IF_ERROR(fill(&FLAGS_tls_cert, "cert_file", tls.cert_file()));
  RLMESH_RETURN_IF_ERROR(fill(&FLAGS_tls_key, "key_file", tls.key_file()));
  RLMESH_RETURN_IF_ERROR(fill(&FLAGS_tls_root_cert, "root_cert_file", tls.root_cert_file()));
  if (tls.mutual()) absl::SetFlag(&FLAGS_tls_mutual, true);
  SetProcessClientTls(ClientTlsFromFlags());
  return absl::OkStatus();
}

// The TLS flags every role the coordinator starts gets: its own.
std::vector<std::string> RoleTlsArgs() {
  std::vector<std::string> args;
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    args.push_back("--tls_cert=" + absl::GetFlag(FLAGS_tls_cert));
    args.push_back("--tls_key=" + absl::GetFlag(FLAGS_tls_key));
  }
  if (!absl::GetFlag(FLAGS_tls_root_cert).empty()) args.push_back("--tls_root_cert=" + absl::GetFlag(FLAGS_tls_root_cert));
  if (absl::GetFlag(FLAGS_tls_mutual)) args.push_back("--tls_mutual");
  return args;
}

// A cluster YAML with its paths made absolute; `launcher` must be known.
// Its tls block becomes this process's TLS settings.
absl::StatusOr<ClusterConfig> LoadCluster(const std::string& path) {
  ClusterConfig config;
  YamlSource src;
  RLMESH_RETURN_IF_ERROR(LoadYamlFile(UserPath(path), &config, &src));
  if (!config.launcher().empty() && config.launcher() != "local" && config.launcher() != "slurm" &&
      config.launcher() != "kubernetes") {
    return absl::InvalidArgumentError(
        absl::StrCat("launcher: '", config.launcher(), "' is not \"local\", \"slurm\" or \"kubernetes\""));
  }
  if (config.launcher() == "kubernetes") RLMESH_RETURN_IF_ERROR(ValidateKubernetesCluster(config));
  RLMESH_RETURN_IF_ERROR(ApplyClusterTls(config.tls()));
  return config;
}

// The options of a Slurm cluster; `coordinator` is the address this
// coordinator serves at (its host is replaced by slurm.coordinator_address's
// when that is set; its port is kept when that has none).
SlurmOptions SlurmOptionsFor(const ClusterOptions& co, const ClusterConfig& config, const std::string& job_name,
                             const std::string& coordinator) {
  SlurmOptions so = SlurmOptionsFromConfig(co, config.slurm(), job_name);
  std::string address = config.slurm().coordinator_address();
  if (address.empty()) {
    address = coordinator;
  } else if (address.find(':') == std::string::npos) {
    address = absl::StrCat(address, ":", coordinator.substr(coordinator.rfind(':') + 1));
  }
  so.coordinator_address = address;
  return so;
}

// --dry-run: the batch script and the steps, nothing submitted.
int PrintDryRun(const SlurmOptions& so) {
  std::fputs(BatchScript(so).c_str(), stdout);
  absl::Status valid = so.Validate();
  if (!valid.ok()) std::fprintf(stderr, "coordinator: warning: %s\n", valid.ToString().c_str());
  return 0;
}

int Serve(Cluster* cluster, int port_override) {
  auto options = ServerOptionsFromFlags("coordinator");
  if (!options.ok()) return Fail("serve", options.status());
  if (port_override > 0 && options->port == 0) options->port = port_override;
  // The cluster's token guards the coordinator's own RPCs too (a cluster
  // YAML with auth_token_file and no --auth_token_file left them open).
  if (cluster != nullptr && options->auth_token.empty()) options->auth_token = cluster->token();
  std::unique_ptr<ExperimentManager> experiments;
  if (cluster != nullptr) {
    ClusterAddresses addresses =
        AddressesOf(*cluster, options->auth_token, cluster->options().run_dir + "/experiments");
    addresses.reward_commands = AllowedCommandPrograms();
    experiments = std::make_unique<ExperimentManager>(std::move(addresses));
  }
  ClusterServices services;
  if (experiments != nullptr) {
    absl::Status s = StartClusterServices(experiments.get(), [cluster] { return cluster->Roles(); },
                                          AddressesOf(*cluster, options->auth_token, ""), *options,
                                          cluster->options().run_dir, &services);
    if (!s.ok()) return Fail("serve", s);
  }
  RpcServer server(*options);
  CoordinatorServiceImpl service(&server.auth(), cluster, experiments.get());
  server.AddService(&service);
  absl::Status started = server.Start();
  if (!started.ok()) return Fail("serve", started);
  if (cluster != nullptr) {
    WriteFileAtomically(cluster->options().run_dir + "/coordinator.address", server.address() + "\n")
        .IgnoreError();
    std::printf("rlmesh: cluster up (coordinator %s)\n", server.address().c_str());
    std::fflush(stdout);  // before the health table, which waits on every role
    const auto roles = cluster->Roles();
    PrintRoles(roles);
    if (absl::GetFlag(FLAGS_exit_after_health)) {
      bool all = true;
      for (const auto& r : roles) all = all && r.health() == "SERVING";
      server.Shutdown();
      cluster->Stop();
      std::printf("rlmesh: cluster stopped (%s)\n", all ? "all roles were serving" : "some roles were NOT serving");
      return all ? 0 : 1;
    }
  }
  const int sig = WaitForTerminationSignal();
  RLMESH_LOG(INFO) << "signal=" << sig << " shutting down";
  if (experiments) experiments->Shutdown();
  server.Shutdown();
  if (cluster != nullptr) cluster->Stop();
  return 0;
}

// The end of a launch whose roles register (Slurm, Kubernetes): prints the
// registered roles, then with --exit_after_health returns 1 unless every one
// serves, else waits for SIGTERM/SIGINT; either way stops taking
// experiments and shuts the server down. The caller stops its launcher.
int ServeRegisteredRoles(Registry* registry, ExperimentManager* experiments, CoordinatorServiceImpl* service,
                         RpcServer* server) {
  const auto roles = registry->Roles();
  PrintRoles(roles);
  int code = 0;
  if (absl::GetFlag(FLAGS_exit_after_health)) {
    for (const auto& r : roles) code = r.health() == "SERVING" ? code : 1;
  } else {
    const int sig = WaitForTerminationSignal();
    RLMESH_LOG(INFO) << "signal=" << sig << " shutting down";
  }
  experiments->Shutdown();
  service->SetExperiments(nullptr);
  server->Shutdown();
  return code;
}

// launch with launcher: slurm. The RPC server starts first: the roles
// register with it while the steps start.
int LaunchSlurm(const ClusterConfig& config, const ClusterOptions& options) {
  auto server_options = ServerOptionsFromFlags("coordinator");
  if (!server_options.ok()) return Fail("launch", server_options.status());
  if (config.coordinator_port() > 0 && server_options->port == 0) server_options->port = config.coordinator_port();
  const std::string job_name = absl::StrCat("rlmesh-", config.name().empty() ? "cluster" : config.name());
  if (absl::GetFlag(FLAGS_dry_run)) {
    return PrintDryRun(SlurmOptionsFor(options, config, job_name,
                                       absl::StrCat(server_options->bind_address, ":",
                                                    server_options->port > 0 ? std::to_string(server_options->port)
                                                                             : "<port>")));
  }
  Registry registry(RegistryOptionsFromFlags());
  RpcServer server(*server_options);
  CoordinatorServiceImpl service(&server.auth(), nullptr, nullptr, &registry);
  server.AddService(&service);
  absl::Status started = server.Start();
  if (!started.ok()) return Fail("launch", started);
  auto slurm = SlurmCluster::Launch(SlurmOptionsFor(options, config, job_name, server.address()), &registry);
  if (!slurm.ok()) {
    server.Shutdown();
    return Fail("launch", slurm.status());
  }
  ClusterAddresses addresses =
      AddressesOf(**slurm, server_options->auth_token, options.tokenizer, options.run_dir + "/experiments");
  addresses.reward_commands = AllowedCommandPrograms();
  addresses.check_placement = [&registry](const ExperimentConfig& c) {
    return CheckWeightSyncPlacement(c.weight_sync().backend(), registry.Roles());
  };
  ExperimentManager experiments(addresses);
  ClusterServices services;
  absl::Status serving = StartClusterServices(&experiments, [&registry] { return registry.Roles(); }, addresses,
                                              *server_options, options.run_dir, &services);
  if (!serving.ok()) {
    experiments.Shutdown();
    server.Shutdown();
    (*slurm)->Stop();
    return Fail("launch", serving);
  }
  service.SetExperiments(&experiments);
  WriteFileAtomically(options.run_dir + "/coordinator.address", server.address() + "\n").IgnoreError();
  std::printf("rlmesh: cluster up on slurm job %s (coordinator %s)\n", (*slurm)->job_id().c_str(),
              server.address().c_str());
  const int code = ServeRegisteredRoles(&registry, &experiments, &service, &server);
  (*slurm)->Stop();
  std::printf("rlmesh: slurm job %s cancelled\n", (*slurm)->job_id().c_str());
  return code;
}

// The files a cluster's Secrets carry, read from where the user named them.
absl::StatusOr<K8sSecretFiles> ReadK8sSecrets(const ClusterConfig& config) {
  auto read = [](const std::string& field, const std::string& path, std::string* out) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    std::ifstream in(UserPath(path), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in || text.str().empty()) return absl::NotFoundError(absl::StrCat(field, ": cannot read ", UserPath(path)));
    *out = text.str();
    return absl::OkStatus();
  };
  K8sSecretFiles f;
  RLMESH_RETURN_IF_ERROR(read("auth_token_file", config.auth_token_file(), &f.auth_token));
  RLMESH_RETURN_IF_ERROR(read("tls.cert_file", config.tls().cert_file(), &f.tls_cert));
  RLMESH_RETURN_IF_ERROR(read("tls.key_file", config.tls().key_file(), &f.tls_key));
  RLMESH_RETURN_IF_ERROR(read("tls.root_cert_file", config.tls().root_cert_file(), &f.tls_root_cert));
  return f;
}

// `k8s` and `launch --dry-run` of a kubernetes cluster: the manifests on
// stdout, or one file per object under --out.
int RenderK8s(const std::string& what, const ClusterConfig& config) {
  auto secrets = ReadK8sSecrets(config);
  if (!secrets.ok()) return Fail(what, secrets.status());
  auto manifests = RenderKubernetes(config, *secrets);
  if (!manifests.ok()) return Fail(what, manifests.status());
  const bool has_secrets = !config.auth_token_file().empty() || !config.tls().cert_file().empty() ||
                           !config.tls().root_cert_file().empty();
  const std::string out = UserPath(absl::GetFlag(FLAGS_out));
  if (out.empty()) {
    std::fputs(JoinManifests(*manifests).c_str(), stdout);
  } else {
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    if (ec) return Fail(what, absl::PermissionDeniedError(absl::StrCat("cannot create ", out, ": ", ec.message())));
    for (const auto& m : *manifests) {
      absl::Status w = WriteFileAtomically(out + "/" + m.file, m.yaml);
      if (!w.ok()) return Fail(what, w);
    }
    std::printf("rlmesh: %zu objects in %s; apply them with: kubectl apply -f %s\n", manifests->size(), out.c_str(),
                out.c_str());
  }
  if (has_secrets) {
    std::fprintf(stderr, "coordinator %s: note: the output holds the token/TLS keys (Secrets, base64); keep it "
                 "out of version control\n", what.c_str());
  }
  return 0;
}

int K8s() {
  const std::string path = absl::GetFlag(FLAGS_cluster);
  if (path.empty()) return Fail("k8s", absl::InvalidArgumentError("--cluster: required"));
  auto loaded = LoadCluster(path);
  if (!loaded.ok()) return Fail("k8s", loaded.status());
  if (loaded->launcher() != "kubernetes") {
    return Fail("k8s", absl::InvalidArgumentError(
                           absl::StrCat("launcher: '", loaded->launcher(), "' is not \"kubernetes\"")));
  }
  return RenderK8s("k8s", *loaded);
}

// launch with launcher: kubernetes, in the coordinator's pod: Kubernetes
// started the roles (StatefulSets); serve the RPC, wait for every role to
// register, then take experiments. A pod that restarts registers again at
// the same DNS name and port, so the addresses stay valid.
int LaunchKubernetes(const ClusterConfig& config) {
  auto server_options = ServerOptionsFromFlags("coordinator");
  if (!server_options.ok()) return Fail("launch", server_options.status());
  const ClusterConfig pod = PodClusterConfig(config);
  if (server_options->port == 0) server_options->port = pod.coordinator_port();
  Registry registry(RegistryOptionsFromFlags());
  RpcServer server(*server_options);
  CoordinatorServiceImpl service(&server.auth(), nullptr, nullptr, &registry);
  server.AddService(&service);
  absl::Status started = server.Start();
  if (!started.ok()) return Fail("launch", started);
  const std::vector<std::string> names = KubernetesRoleNames(pod);
  std::printf("rlmesh: coordinator %s waiting for %zu roles to register at %s\n", server.address().c_str(),
              names.size(), KubernetesCoordinatorAddress(pod).c_str());
  std::fflush(stdout);
  const absl::Time deadline = absl::Now() + absl::Seconds(pod.kubernetes().start_timeout_seconds());
  std::map<std::string, std::string> address;
  for (const auto& name : names) {
    auto info = registry.WaitFor(name, 0, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!info.ok()) {
      server.Shutdown();
      return Fail("launch", absl::DeadlineExceededError(absl::StrCat(
                                name, " did not register within ", pod.kubernetes().start_timeout_seconds(),
                                " s (kubernetes.start_timeout_seconds); see `kubectl -n ", pod.kubernetes().namespace_(),
                                " get pods` and the pod's log")));
    }
    address[name] = info->address();
  }
  ClusterAddresses a;
  a.replay_buffer = address.at("replay_buffer");
  for (int i = 0; i < pod.reward_servers(); ++i) a.reward_servers.push_back(address.at(absl::StrCat("reward-", i)));
  for (int i = 0; i < pod.rollout_workers(); ++i) a.rollout_workers.push_back(address.at(absl::StrCat("rollout-", i)));
  for (int i = 0; i < pod.learners(); ++i) a.learners.push_back(address.at(absl::StrCat("learner-", i)));
  a.auth_token = server_options->auth_token;
  a.tokenizer = pod.tokenizer();
  a.run_root = pod.run_dir() + "/experiments";
  // The manifests start the reward pods with no --allowed_commands.
  a.reward_commands = std::vector<std::string>();
  // Learner 0 hosts the c10d store: the workers and the other learners
  // reach it at the stable DNS name it advertised (learner-0.learner...).
  a.sync_store_host = HostOf(a.learners[0]);
  std::error_code ec;
  std::filesystem::create_directories(a.run_root, ec);
  if (ec) RLMESH_LOG(WARNING) << "cannot create " << a.run_root << ": " << ec.message();
  a.check_placement = [&registry](const ExperimentConfig& c) {
    return CheckWeightSyncPlacement(c.weight_sync().backend(), registry.Roles());
  };
  ExperimentManager experiments(a);
  ClusterServices services;
  absl::Status serving =
      StartClusterServices(&experiments, [&registry] { return registry.Roles(); }, a, *server_options, pod.run_dir(),
                           &services);
  if (!serving.ok()) {
    experiments.Shutdown();
    server.Shutdown();
    return Fail("launch", serving);
  }
  service.SetExperiments(&experiments);
  WriteFileAtomically(pod.run_dir() + "/coordinator.address", server.address() + "\n").IgnoreError();
  std::printf("rlmesh: cluster up on kubernetes (coordinator %s)\n", server.address().c_str());
  return ServeRegisteredRoles(&registry, &experiments, &service, &server);
}

int Launch() {
  const std::string path = absl::GetFlag(FLAGS_cluster);
  if (path.empty()) return Fail("launch", absl::InvalidArgumentError("--cluster: required"));
  auto loaded = LoadCluster(path);
  if (!loaded.ok()) return Fail("launch", loaded.status());
  ClusterConfig config = *loaded;
  if (config.has_gpus() && !config.launcher().empty() && config.launcher() != "local") {
    // Slurm binds GPUs itself (gres) and Kubernetes through
    // kubernetes.*.gpus; mapping this block onto them is not built, and a
    // placement silently dropped would be worse.
    return Fail("launch", absl::InvalidArgumentError(absl::StrCat("gpus: only the local launcher places GPUs; remove "
                                                                  "it for launcher: ", config.launcher())));
  }
  if (config.launcher() == "kubernetes") {
    return absl::GetFlag(FLAGS_dry_run) ? RenderK8s("launch", config) : LaunchKubernetes(config);
  }
  std::string run_dir = absl::GetFlag(FLAGS_run_dir);
  if (run_dir.empty()) run_dir = config.run_dir();
  if (run_dir.empty()) run_dir = absl::StrCat("runs/", config.name().empty() ? "local" : config.name());
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (bin_dir.empty()) bin_dir = DefaultBinDir();
  if (!config.tokenizer().empty() && config.tokenizer() != "char") config.set_tokenizer(UserPath(config.tokenizer()));
  ClusterOptions options = ClusterOptionsFromConfig(config, bin_dir, UserPath(run_dir));
  options.role_args = RoleTlsArgs();
  options.learner_args.push_back(LearnerWriteRoots(options.run_dir, nullptr));
  for (std::string& a : RewardAllowedCommands(nullptr)) options.reward_args.push_back(std::move(a));
  if (!options.auth_token_file.empty()) options.auth_token_file = UserPath(options.auth_token_file);
  if (!options.buffer_path.empty()) options.buffer_path = UserPath(options.buffer_path);
  if (config.launcher() == "slurm") return LaunchSlurm(config, options);
  auto cluster = Cluster::Launch(options);
  if (!cluster.ok()) return Fail("launch", cluster.status());
  return Serve(cluster->get(), config.coordinator_port());
}

int Status(const std::vector<std::string>& args) {
  auto client = CliClient();
  if (!client.ok()) return Fail("status", client.status());
  auto stub = Coordinator::NewStub(client->channel());
  StatusRequest req;
  if (!args.empty()) req.set_experiment_id(args[0]);
  StatusResponse resp;
  auto ctx = client->NewContext();
  grpc::Status s = stub->GetStatus(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("status", FromGrpcStatus(s));
  if (resp.has_experiment()) {
    const auto& e = resp.experiment();
    std::printf("experiment %s: %s stage=%s step=%lld/%lld phase=%s\n", e.experiment_id().c_str(),
                e.state().c_str(), e.stage().c_str(), static_cast<long long>(e.step()),
                static_cast<long long>(e.total_steps()), e.phase().c_str());
    for (const auto& [k, v] : e.metrics()) std::printf("  %-24s %g\n", k.c_str(), v);
  }
  PrintRoles({resp.roles().begin(), resp.roles().end()});
  return 0;
}

int List() {
  auto client = CliClient();
  if (!client.ok()) return Fail("list", client.status());
  auto stub = Coordinator::NewStub(client->channel());
  ListResponse resp;
  auto ctx = client->NewContext();
  grpc::Status s = stub->List(ctx.get(), ListRequest(), &resp);
  if (!s.ok()) return Fail("list", FromGrpcStatus(s));
  std::printf("%-28s %-10s %-10s %s\n", "ID", "STATE", "STAGE", "STEP");
  for (const auto& e : resp.experiments()) {
    std::printf("%-28s %-10s %-10s %lld/%lld\n", e.experiment_id().c_str(), e.state().c_str(),
                e.stage().c_str(), static_cast<long long>(e.step()), static_cast<long long>(e.total_steps()));
  }
  return 0;
}

int Cancel(const std::vector<std::string>& args) {
  if (args.size() != 1) return Fail("cancel", absl::InvalidArgumentError("expected one experiment id"));
  auto client = CliClient();
  if (!client.ok()) return Fail("cancel", client.status());
  auto stub = Coordinator::NewStub(client->channel());
  CancelRequest req;
  req.set_experiment_id(args[0]);
  CancelResponse resp;
  auto ctx = client->NewContext();
  grpc::Status s = stub->Cancel(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("cancel", FromGrpcStatus(s));
  std::printf("%s: %s\n", args[0].c_str(), resp.state().c_str());
  return 0;
}

int Submit(const std::vector<std::string>& args, const std::vector<std::string>& sets) {
  if (args.size() != 1) return Fail("submit", absl::InvalidArgumentError("expected one experiment YAML"));
  auto cfg = LoadExperiment(args[0], sets);
  if (!cfg.ok()) return Fail("submit", cfg.status());
  // The coordinator runs elsewhere: send it an absolute tokenizer path.
  if (!cfg->model().tokenizer().empty() && cfg->model().tokenizer() != "char") {
    cfg->mutable_model()->set_tokenizer(std::filesystem::absolute(UserPath(cfg->model().tokenizer())).string());
  }
  auto client = CliClient();
  if (!client.ok()) return Fail("submit", client.status());
  auto stub = Coordinator::NewStub(client->channel());
  SubmitRequest req;
  *req.mutable_experiment() = *cfg;
  SubmitResponse resp;
  auto ctx = client->NewContext();
  grpc::Status s = stub->Submit(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("submit", FromGrpcStatus(s));
  std::printf("%s\n", resp.experiment_id().c_str());
  return 0;
}

// The policy's shape: the checkpoint's config.json, or the scratch sizes
// with the tokenizer's vocabulary (as the learner builds it).
absl::StatusOr<actor::ModelConfig> PolicyShape(const ExperimentConfig& cfg) {
  const ModelConfig& mc = cfg.model();
  if (mc.init() == "checkpoint") return actor::ModelConfig::FromHfConfigJson(mc.path() + "/config.json");
  RLMESH_ASSIGN_OR_RETURN(auto tokenizer, actor::LoadTokenizer(UserPath(mc.tokenizer())));
  actor::ModelConfig m;
  m.arch = mc.arch();
  m.vocab_size = tokenizer->vocab_size();
  m.hidden_size = mc.hidden();
  m.intermediate_size = mc.intermediate() != 0 ? mc.intermediate() : (8 * m.hidden_size / 3 + 7) / 8 * 8;
  m.num_layers = mc.layers();
  m.num_heads = mc.heads();
  m.num_kv_heads = mc.kv_heads();
  m.head_dim = mc.head_dim();
  m.max_positions = mc.max_positions();
  m.tie_embeddings = mc.tie_embeddings();
  return m;
}

// The longest rows the experiment trains on and generates, from its task's
// prompts and targets as the run encodes them. Preference pairs (DPO,
// reward models) and corpora are bounded by model.max_positions (0).
absl::StatusOr<PlanSequences> LongestSequences(const ExperimentConfig& cfg) {
  const std::string spec = UserPath(cfg.model().tokenizer());
  RLMESH_ASSIGN_OR_RETURN(auto tokenizer, actor::LoadTokenizer(spec));
  RLMESH_ASSIGN_OR_RETURN(auto task, MakeTask(cfg.task(), cfg.seed(), spec));
  int64_t prompt = 0, target = 0;
  for (const auto* split : {&task->train(), &task->eval()}) {
    for (const Example& e : *split) {
      prompt = std::max<int64_t>(prompt, EncodePrompt(*tokenizer, e.prompt).size());
      target = std::max<int64_t>(target, EncodeResponse(*tokenizer, e.answer).size());
    }
  }
  if (prompt == 0) return PlanSequences{};
  const int64_t generate = prompt + cfg.rollout().sampling().max_new_tokens();
  PlanSequences out{.train = 0, .generate = generate};
  for (const Stage& stage : cfg.stages()) {
    if (stage.has_sft()) {
      out.train = std::max(out.train, prompt + target);
    } else if (RlSettings(stage) != nullptr) {
      out.train = std::max(out.train, generate);
    } else {
      return PlanSequences{.train = 0, .generate = generate};  // pairs: the bound
    }
  }
  return out;
}

// `coordinator plan` and `run --dry-run` of a local run: the memory plan,
// and 1 when it does not fit.
int PrintPlan(const char* command, const ExperimentConfig& cfg) {
  auto shape = PolicyShape(cfg);
  if (!shape.ok()) return Fail(command, shape.status());
  // The context the roles use is the experiment's (validated against the
  // checkpoint's at load).
  shape->max_positions = cfg.model().max_positions();
  auto sequences = LongestSequences(cfg);
  if (!sequences.ok()) return Fail(command, sequences.status());
  PlanCapacity capacity;
  capacity.host_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  capacity.gpu_bytes = absl::GetFlag(FLAGS_gpu_memory_gib) * (1 << 30);
  auto plan = PlanMemory(cfg, *shape, *sequences, capacity);
  if (!plan.ok()) return Fail(command, plan.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", MemoryPlanJson(*plan).dump(2).c_str());
  } else {
    std::printf("%s", FormatMemoryPlan(*plan).c_str());
  }
  absl::Status fits = CheckMemoryPlan(*plan);
  if (!fits.ok()) return Fail(command, fits);
  return 0;
}

int Plan(const std::vector<std::string>& args, const std::vector<std::string>& sets) {
  if (args.size() != 1) return Fail("plan", absl::InvalidArgumentError("expected one experiment YAML"));
  auto cfg = LoadExperiment(args[0], sets);
  if (!cfg.ok()) return Fail("plan", cfg.status());
  return PrintPlan("plan", *cfg);
}

// `eval_folder`: evaluate that folder instead of running the stages
// (`coordinator eval`).
int Run(const std::vector<std::string>& args, const std::vector<std::string>& sets,
        const std::string& eval_folder = "") {
  const char* const command = eval_folder.empty() ? "run" : "eval";
  const std::string resume = UserPath(absl::GetFlag(FLAGS_resume));
  // --dry-run prints what would be submitted to Slurm and touches nothing.
  const bool dry_run = absl::GetFlag(FLAGS_dry_run);
  // A local run's dry run is its memory plan.
  if (dry_run && absl::GetFlag(FLAGS_cluster).empty()) {
    if (args.size() != 1) return Fail(command, absl::InvalidArgumentError("expected one experiment YAML"));
    auto cfg = LoadExperiment(args[0], sets);
    if (!cfg.ok()) return Fail(command, cfg.status());
    return PrintPlan(command, *cfg);
  }
  absl::StatusOr<ExperimentConfig> cfg;
  std::string id, run_dir;
  if (!resume.empty()) {
    // The run's own saved config: a resumed run is the same experiment.
    if (!args.empty()) return Fail(command, absl::InvalidArgumentError("--resume takes no experiment YAML"));
    // The original run's --set overrides first, then any given now.
    std::vector<std::string> all_sets;
    std::ifstream overrides(resume + "/overrides.txt");
    for (std::string line; std::getline(overrides, line);) {
      if (!line.empty()) all_sets.push_back(line);
    }
    all_sets.insert(all_sets.end(), sets.begin(), sets.end());
    cfg = LoadExperiment(resume + "/experiment.yaml", all_sets);
    if (!cfg.ok()) return Fail(command, cfg.status());
    run_dir = std::filesystem::path(resume).lexically_normal().string();
    while (!run_dir.empty() && run_dir.back() == '/') run_dir.pop_back();
    id = std::filesystem::path(run_dir).filename().string();
  } else {
    if (args.size() != 1) return Fail(command, absl::InvalidArgumentError("expected one experiment YAML"));
    cfg = LoadExperiment(args[0], sets);
    if (!cfg.ok()) return Fail(command, cfg.status());
    id = absl::StrCat(cfg->name(), eval_folder.empty() ? "" : "-eval", "-",
                      absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()));
    std::string run_root = absl::GetFlag(FLAGS_run_dir);
    if (run_root.empty()) run_root = cfg->run_dir();
    run_dir = UserPath(absl::StrCat(run_root, "/", id));
  }
  if (resume.empty() && !dry_run) {
    std::error_code ec;
    std::filesystem::create_directories(run_dir, ec);
    // Keep the exact experiment (overrides applied) for --resume.
    std::ifstream in(UserPath(args[0]));
    std::stringstream text;
    text << in.rdbuf();
    std::string saved = text.str();
    for (const auto& s : sets) saved += "\n# --set " + s;
    absl::Status w = WriteFileAtomically(run_dir + "/experiment.yaml", saved);
    if (!w.ok()) return Fail(command, w);
    if (!sets.empty()) {
      absl::Status ws = WriteFileAtomically(run_dir + "/overrides.txt", absl::StrJoin(sets, "\n") + "\n");
      if (!ws.ok()) return Fail(command, ws);
    }
  }

  // --cluster with launcher: slurm runs the roles as steps of one allocation.
  ClusterConfig slurm_config;
  const bool on_slurm = !absl::GetFlag(FLAGS_cluster).empty();
  if (on_slurm) {
    auto loaded = LoadCluster(absl::GetFlag(FLAGS_cluster));
    if (!loaded.ok()) return Fail(command, loaded.status());
    if (loaded->launcher() != "slurm") {
      return Fail(command, absl::InvalidArgumentError("--cluster: run takes a cluster with launcher: slurm (a local "
                                                    "cluster is built from the experiment)"));
    }
    slurm_config = *loaded;
  }

  // The cluster this experiment needs, on this host.
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  ClusterOptions co;
  co.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty() ? DefaultBinDir() : absl::GetFlag(FLAGS_bin_dir);
  co.run_dir = run_dir;
  co.rollout_workers = cfg->rollout().workers();
  co.reward_servers = cfg->reward().servers();
  co.learners = cfg->learner().shards();
  co.auth_token_file = UserPath(absl::GetFlag(FLAGS_auth_token_file));
  co.role_args = RoleTlsArgs();
  const std::string tokenizer = cfg->model().tokenizer() == "char" ? "char" : UserPath(cfg->model().tokenizer());
  co.tokenizer = tokenizer;
  // The experiment's rollout settings become the workers' flags.
  // model.threads, else the cores shared out over the roles that compute.
  const int threads = cfg->model().threads();
  co.rollout_args = {"--tokenizer=" + tokenizer,
                     absl::StrCat("--threads=", threads > 0 ? threads : std::max(1, cores / co.rollout_workers))};
  if (cfg->rollout().max_batch() > 0) co.rollout_args.push_back(absl::StrCat("--max_batch=", cfg->rollout().max_batch()));
  if (cfg->rollout().max_queue() > 0) co.rollout_args.push_back(absl::StrCat("--max_queue=", cfg->rollout().max_queue()));
  if (!cfg->rollout().on_update().empty()) co.rollout_args.push_back("--on_update=" + cfg->rollout().on_update());
  if (cfg->rollout().tp() > 1) co.rollout_args.push_back(absl::StrCat("--tensor_parallel=", cfg->rollout().tp()));
  // rollout.device, else model.device (validated by name when the config
  // loaded; each worker resolves it at start and fails naming it).
  const std::string rollout_device = !cfg->rollout().device().empty() ? cfg->rollout().device() : cfg->model().device();
  if (!rollout_device.empty()) co.rollout_args.push_back("--device=" + rollout_device);
  if (cfg->rollout().cuda_memory_fraction() > 0) {
    co.rollout_args.push_back(absl::StrCat("--cuda_memory_fraction=", cfg->rollout().cuda_memory_fraction()));
  }
  if (cfg->rollout().cuda_graphs()) co.rollout_args.push_back("--cuda_graphs");
  co.rollout_args.push_back("--dtype=" + RolloutDtype(cfg->rollout(), rollout_device));
  co.reward_args = {"--tokenizer=" + tokenizer};
  for (std::string& a : RewardAllowedCommands(&*cfg)) co.reward_args.push_back(std::move(a));
  if (!cfg->reward().reward_model().empty()) {
    co.reward_args.push_back("--reward_model=" + UserPath(cfg->reward().reward_model()));
  }
  if (cfg->reward().reward_model_weight() != 0) {
    co.reward_args.push_back(absl::StrCat("--reward_model_weight=", cfg->reward().reward_model_weight()));
  }
  co.learner_args = {absl::StrCat("--threads=", threads > 0 ? threads : std::max(1, cores / co.learners)),
                     LearnerWriteRoots(run_dir, &*cfg)};
  // Several learner shards on this host's GPUs: one each, from
  // model.device on (the workers' device was taken from model.device above).
  // Slurm steps see the GPUs their allocation binds.
  if (!on_slurm) co.learner_gpus = PlaceLearnerShardsOnGpus(&*cfg);
  if (cfg->learner().cuda_memory_fraction() > 0) {
    co.learner_args.push_back(absl::StrCat("--cuda_memory_fraction=", cfg->learner().cuda_memory_fraction()));
  }
  // environment.launch: the built-in environment server beside the roles.
  if (cfg->environment().launch()) {
    if (on_slurm) {
      return Fail(command, absl::UnimplementedError(
                             "environment.launch: on Slurm the environment server is not placed by rlmesh; start "
                             "one and give environment.address"));
    }
    co.environment_servers = 1;
  }
  const bool profile = absl::GetFlag(FLAGS_profile) && !dry_run;
  if (profile) {
    co.trace_dir = run_dir + "/profile";
    std::error_code ec;
    std::filesystem::create_directories(co.trace_dir, ec);
    if (ec) return Fail(command, absl::PermissionDeniedError(absl::StrCat("cannot create ", co.trace_dir)));
    EnableTracing(co.trace_dir + "/coordinator.json", "coordinator");
  }
  if (!dry_run) {
    std::printf("rlmesh: starting %d rollout worker(s), %d reward server(s), %d learner(s), replay buffer; run dir %s\n",
                co.rollout_workers, co.reward_servers, co.learners, run_dir.c_str());
    std::fflush(stdout);
  }
  auto server_options = ServerOptionsFromFlags("coordinator");
  if (!server_options.ok()) return Fail(command, server_options.status());
  const std::string job_name = "rlmesh-" + id;
  if (dry_run) {
    return PrintDryRun(SlurmOptionsFor(co, slurm_config, job_name,
                                       absl::StrCat(server_options->bind_address, ":",
                                                    server_options->port > 0 ? std::to_string(server_options->port)
                                                                             : "<port>")));
  }
  std::unique_ptr<Cluster> local;
  if (!on_slurm) {
    auto cluster = Cluster::Launch(co);
    if (!cluster.ok()) return Fail(command, cluster.status());
    local = std::move(*cluster);
    if (cfg->environment().launch()) {
      // From here on the experiment names the server it uses, as if the
      // user had (launch and address together are refused at load).
      cfg->mutable_environment()->set_address(local->Address(ROLE_ENVIRONMENT));
      cfg->mutable_environment()->set_launch(false);
      std::printf("rlmesh: environment server at %s\n", cfg->environment().address().c_str());
    }
  }
  Registry registry(RegistryOptionsFromFlags());
  RpcServer server(*server_options);
  CoordinatorServiceImpl service(&server.auth(), local.get(), nullptr, &registry);
  server.AddService(&service);
  absl::Status started = server.Start();
  if (!started.ok()) return Fail(command, started);
  std::unique_ptr<SlurmCluster> slurm;
  if (on_slurm) {
    auto launched = SlurmCluster::Launch(SlurmOptionsFor(co, slurm_config, job_name, server.address()), &registry);
    if (!launched.ok()) {
      server.Shutdown();
      return Fail(command, launched.status());
    }
    slurm = std::move(*launched);
    std::printf("rlmesh: roles running as steps of slurm job %s\n", slurm->job_id().c_str());
    absl::Status placed = CheckWeightSyncPlacement(cfg->weight_sync().backend(), registry.Roles());
    if (!placed.ok()) {
      server.Shutdown();
      slurm->Stop();
      return Fail(command, placed);
    }
  }

  RunnerOptions ro;
  ro.experiment = *cfg;
  ro.experiment_id = id;
  ro.run_dir = run_dir;
  const ClusterAddresses a = local ? AddressesOf(*local, server_options->auth_token, run_dir)
                                   : AddressesOf(*slurm, server_options->auth_token, co.tokenizer, run_dir);
  ro.replay_buffer = a.replay_buffer;
  ro.reward_servers = a.reward_servers;
  ro.rollout_workers = a.rollout_workers;
  ro.learners = a.learners;
  ro.auth_token = a.auth_token;
  if (slurm) ro.sync_store_host = a.sync_store_host;
  ro.resume = !resume.empty();
  ro.evaluate_folder = eval_folder;
  ro.eval_samples = UserPath(absl::GetFlag(FLAGS_out));
  ExperimentRunner runner(ro);
  std::unique_ptr<MetricsHttpServer> metrics;
  if (cfg->logging().prometheus_port() >= 0) {
    auto m = MetricsHttpServer::Start(server_options->bind_address, cfg->logging().prometheus_port(),
                                      [&runner] { return std::vector<ExperimentStatus>{runner.status()}; });
    if (!m.ok()) return Fail(command, m.status());
    metrics = std::move(*m);
    std::printf("rlmesh: metrics on http://%s:%d/metrics\n", server_options->bind_address.c_str(), metrics->port());
  }
  // Roles as the launcher sees them: the local cluster's children, or what
  // registered from the Slurm steps.
  std::function<std::vector<RoleInfo>()> roles = [&local, &registry] {
    return local ? local->Roles() : registry.Roles();
  };
  std::unique_ptr<HangWatch> hang_watch =
      StartHangWatch(cfg->logging().hang_dump_seconds(), run_dir + "/hangs",
                     [&runner] { return std::optional<ExperimentStatus>(runner.status()); }, roles);
  std::unique_ptr<ClusterDashboardSource> dashboard_source;
  ClusterAddresses dashboard_addresses = a;
  dashboard_addresses.tokenizer = co.tokenizer;
  auto dashboard = StartDashboard([&runner] { return std::vector<ExperimentStatus>{runner.status()}; }, roles,
                                  dashboard_addresses, *server_options, &dashboard_source);
  if (!dashboard.ok()) return Fail(command, dashboard.status());
  std::printf("rlmesh: cluster up (coordinator %s); experiment %s\n", server.address().c_str(), id.c_str());
  std::printf("rlmesh: query it with: bazel-bin/replay_buffer/cli query --address %s --experiment %s --limit 5\n",
              a.replay_buffer.c_str(), id.c_str());
  std::fflush(stdout);

  // SIGINT/SIGTERM cancel the run at the next step boundary.
  std::atomic<bool> finished{false};
  std::thread signals([&] {
    WaitForTerminationSignal();
    if (!finished.load()) {
      std::fprintf(stderr, "rlmesh: cancelling (signal)\n");
      runner.Cancel();
    }
  });
  absl::Status s = runner.Run();
  finished.store(true);
  ::kill(::getpid(), SIGTERM);  // wakes the signal thread
  signals.join();
  server.Shutdown();
  if (local) local->Stop();  // the roles write their traces as they stop
  if (slurm) slurm->Stop();
  if (profile) WriteProfile(co.trace_dir, run_dir + "/profile.json");
  if (!s.ok()) return Fail(command, s);
  return 0;
}

// `coordinator eval CONFIG --model DIR`: `run` with the model folder as
// the initial model and no stage run; --data and --workers set the
// held-out file and the workers.
int Eval(const std::vector<std::string>& args, std::vector<std::string> sets) {
  if (args.size() != 1) return Fail("eval", absl::InvalidArgumentError("expected one experiment YAML"));
  if (!absl::GetFlag(FLAGS_resume).empty()) return Fail("eval", absl::InvalidArgumentError("--resume: not with eval"));
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) return Fail("eval", absl::InvalidArgumentError("--model: required (the folder to evaluate)"));
  const std::string folder = std::filesystem::absolute(UserPath(model)).lexically_normal().string();
  std::error_code ec;
  if (!std::filesystem::exists(folder + "/config.json", ec)) {
    return Fail("eval", absl::NotFoundError(absl::StrCat("--model: ", folder, "/config.json does not exist")));
  }
  sets.push_back("model.init=checkpoint");
  sets.push_back("model.path=" + folder);
  if (!absl::GetFlag(FLAGS_data).empty()) {
    const std::string data = std::filesystem::absolute(UserPath(absl::GetFlag(FLAGS_data))).string();
    if (!std::filesystem::exists(data, ec)) {
      return Fail("eval", absl::NotFoundError(absl::StrCat("--data: ", data, " does not exist")));
    }
    sets.push_back("task.eval_path=" + data);
  }
  if (absl::GetFlag(FLAGS_workers) < 0) return Fail("eval", absl::InvalidArgumentError("--workers: must be >= 1"));
  if (absl::GetFlag(FLAGS_workers) > 0) sets.push_back(absl::StrCat("rollout.workers=", absl::GetFlag(FLAGS_workers)));
  return Run(args, sets, folder);
}

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
