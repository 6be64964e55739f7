#include "coordinator/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/path_root.h"
#include "common/proto_yaml.h"
#include "common/server_flags.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "coordinator/experiment_config.h"
#include "coordinator/k8s_manifests.h"
#include "coordinator/model_defaults.h"

namespace rlmesh {

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

namespace {

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

}  // namespace

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

// --allowed_commands, resolved against where the user typed the command.
std::vector<std::string> AllowedCommandPrograms() {
  std::vector<std::string> programs;
  for (const std::string& p : absl::GetFlag(FLAGS_allowed_commands)) programs.push_back(ResolvePath(UserPath(p)));
  return programs;
}

// The reward servers' --allowed_commands: the programs of `cfg`'s command
// verifiers (the experiment `run` starts; null for `launch`, whose
// experiments arrive later) and --allowed_commands, resolved against this
// working directory. Empty when there are none (the servers then run no
// program a request names).
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

namespace {

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

}  // namespace

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

}  // namespace rlmesh
