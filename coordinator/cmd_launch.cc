// `coordinator launch --cluster CLUSTER.yaml`: the roles as child processes
// (then `serve`), Slurm steps, or Kubernetes pods already started, and the
// Coordinator RPC over them.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/log.h"
#include "common/rpc_server.h"
#include "common/server_flags.h"
#include "coordinator/cli.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/k8s_manifests.h"

namespace rlmesh {
namespace {

// The Coordinator RPC of a launch whose roles register (Slurm, Kubernetes):
// the registry they register with, and the server with its service over it,
// not yet started.
struct RegisteredCoordinator {
  explicit RegisteredCoordinator(const ServerOptions& options)
      : registry(RegistryOptionsFromFlags()), server(options), service(&server.auth(), nullptr, nullptr, &registry) {
    server.AddService(&service);
  }
  Registry registry;
  RpcServer server;
  CoordinatorServiceImpl service;
};

// The end of a launch whose roles register: takes experiments on `addresses`
// (their weight-sync backend checked against where the roles registered)
// with the cluster's services, writes <run_dir>/coordinator.address and
// prints that the cluster is up `on` where. Then prints the registered
// roles, and with --exit_after_health gives 1 unless every one serves, else
// waits for SIGTERM/SIGINT; either way stops taking experiments and shuts
// the server down. The error of services that did not start, the server
// shut down. The caller stops its launcher.
absl::StatusOr<int> ServeRegisteredRoles(RegisteredCoordinator* c, ClusterAddresses addresses,
                                         const ServerOptions& server_options, const std::string& run_dir,
                                         const std::string& on) {
  Registry* registry = &c->registry;
  addresses.check_placement = [registry](const ExperimentConfig& cfg) {
    return CheckWeightSyncPlacement(cfg.weight_sync().backend(), registry->Roles());
  };
  ExperimentManager experiments(addresses);
  ClusterServices services;
  absl::Status serving = StartClusterServices(&experiments, [registry] { return registry->Roles(); }, addresses,
                                              server_options, run_dir, &services);
  if (!serving.ok()) {
    experiments.Shutdown();
    c->server.Shutdown();
    return serving;
  }
  c->service.SetExperiments(&experiments);
  WriteFileAtomically(run_dir + "/coordinator.address", c->server.address() + "\n").IgnoreError();
  std::printf("rlmesh: cluster up on %s (coordinator %s)\n", on.c_str(), c->server.address().c_str());
  const auto roles = registry->Roles();
  PrintRoles(roles);
  int code = 0;
  if (absl::GetFlag(FLAGS_exit_after_health)) {
    for (const auto& r : roles) code = r.health() == "SERVING" ? code : 1;
  } else {
    const int sig = WaitForTerminationSignal();
    RLMESH_LOG(INFO) << "signal=" << sig << " shutting down";
  }
  experiments.Shutdown();
  c->service.SetExperiments(nullptr);
  c->server.Shutdown();
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
  RegisteredCoordinator c(*server_options);
  absl::Status started = c.server.Start();
  if (!started.ok()) return Fail("launch", started);
  auto slurm = SlurmCluster::Launch(SlurmOptionsFor(options, config, job_name, c.server.address()), &c.registry);
  if (!slurm.ok()) {
    c.server.Shutdown();
    return Fail("launch", slurm.status());
  }
  ClusterAddresses addresses =
      AddressesOf(**slurm, server_options->auth_token, options.tokenizer, options.run_dir + "/experiments");
  addresses.reward_commands = AllowedCommandPrograms();
  const absl::StatusOr<int> code = ServeRegisteredRoles(&c, std::move(addresses), *server_options, options.run_dir,
                                                        absl::StrCat("slurm job ", (*slurm)->job_id()));
  (*slurm)->Stop();
  if (!code.ok()) return Fail("launch", code.status());
  std::printf("rlmesh: slurm job %s cancelled\n", (*slurm)->job_id().c_str());
  return *code;
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
  RegisteredCoordinator c(*server_options);
  absl::Status started = c.server.Start();
  if (!started.ok()) return Fail("launch", started);
  const std::vector<std::string> names = KubernetesRoleNames(pod);
  std::printf("rlmesh: coordinator %s waiting for %zu roles to register at %s\n", c.server.address().c_str(),
              names.size(), KubernetesCoordinatorAddress(pod).c_str());
  std::fflush(stdout);
  const absl::Time deadline = absl::Now() + absl::Seconds(pod.kubernetes().start_timeout_seconds());
  std::map<std::string, std::string> address;
  for (const auto& name : names) {
    auto info = c.registry.WaitFor(name, 0, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!info.ok()) {
      c.server.Shutdown();
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
  const absl::StatusOr<int> code = ServeRegisteredRoles(&c, std::move(a), *server_options, pod.run_dir(), "kubernetes");
  if (!code.ok()) return Fail("launch", code.status());
  return *code;
}

}  // namespace

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

}  // namespace rlmesh
