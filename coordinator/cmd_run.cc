// `coordinator run EXPERIMENT.yaml`: launch + submit + follow + clean
// shutdown of one experiment, its roles local or Slurm steps.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/atomic_file.h"
#include "common/rpc_server.h"
#include "common/server_flags.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "coordinator/cli.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/experiment_config.h"
#include "coordinator/runner.h"

namespace rlmesh {
namespace {

// The experiment a run executes, its id and its folder.
struct RunTarget {
  ExperimentConfig cfg;
  std::string id;
  std::string run_dir;
};

// With --resume (`resume` non-empty) the run directory's saved experiment
// with its saved overrides; else `args[0]` with `sets`, in a new folder
// under --run_dir (or the experiment's run_dir) named after the experiment
// and the time.
absl::StatusOr<RunTarget> ResolveRun(const std::vector<std::string>& args, const std::vector<std::string>& sets,
                                     const std::string& resume, const std::string& eval_folder) {
  RunTarget t;
  if (!resume.empty()) {
    // The run's own saved config: a resumed run is the same experiment.
    if (!args.empty()) return absl::InvalidArgumentError("--resume takes no experiment YAML");
    // The original run's --set overrides first, then any given now.
    std::vector<std::string> all_sets;
    std::ifstream overrides(resume + "/overrides.txt");
    for (std::string line; std::getline(overrides, line);) {
      if (!line.empty()) all_sets.push_back(line);
    }
    all_sets.insert(all_sets.end(), sets.begin(), sets.end());
    RLMESH_ASSIGN_OR_RETURN(t.cfg, LoadExperiment(resume + "/experiment.yaml", all_sets));
    t.run_dir = std::filesystem::path(resume).lexically_normal().string();
    while (!t.run_dir.empty() && t.run_dir.back() == '/') t.run_dir.pop_back();
    t.id = std::filesystem::path(t.run_dir).filename().string();
  } else {
    if (args.size() != 1) return absl::InvalidArgumentError("expected one experiment YAML");
    RLMESH_ASSIGN_OR_RETURN(t.cfg, LoadExperiment(args[0], sets));
    t.id = absl::StrCat(t.cfg.name(), eval_folder.empty() ? "" : "-eval", "-",
                        absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()));
    std::string run_root = absl::GetFlag(FLAGS_run_dir);
    if (run_root.empty()) run_root = t.cfg.run_dir();
    t.run_dir = UserPath(absl::StrCat(run_root, "/", t.id));
  }
  return t;
}

// Creates a new run's folder and keeps the exact experiment there
// (`yaml` as the user wrote it, overrides appended as comments, and
// overrides.txt) for --resume.
absl::Status SaveExperiment(const std::string& yaml, const std::vector<std::string>& sets,
                            const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  // Keep the exact experiment (overrides applied) for --resume.
  std::ifstream in(UserPath(yaml));
  std::stringstream text;
  text << in.rdbuf();
  std::string saved = text.str();
  for (const auto& s : sets) saved += "\n# --set " + s;
  RLMESH_RETURN_IF_ERROR(WriteFileAtomically(run_dir + "/experiment.yaml", saved));
  if (!sets.empty()) {
    RLMESH_RETURN_IF_ERROR(WriteFileAtomically(run_dir + "/overrides.txt", absl::StrJoin(sets, "\n") + "\n"));
  }
  return absl::OkStatus();
}

// --cluster with launcher: slurm runs the roles as steps of one allocation.
absl::StatusOr<ClusterConfig> LoadSlurmCluster() {
  RLMESH_ASSIGN_OR_RETURN(ClusterConfig loaded, LoadCluster(absl::GetFlag(FLAGS_cluster)));
  if (loaded.launcher() != "slurm") {
    return absl::InvalidArgumentError("--cluster: run takes a cluster with launcher: slurm (a local "
                                      "cluster is built from the experiment)");
  }
  return loaded;
}

// The cluster this experiment needs, on this host: how many of each role
// and the flags the experiment's settings become. Places the learner
// shards on this host's GPUs (in `cfg`) unless the roles run on Slurm.
absl::StatusOr<ClusterOptions> RunClusterOptions(ExperimentConfig* cfg, const std::string& run_dir, bool on_slurm) {
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
  for (std::string& a : RewardAllowedCommands(cfg)) co.reward_args.push_back(std::move(a));
  if (!cfg->reward().reward_model().empty()) {
    co.reward_args.push_back("--reward_model=" + UserPath(cfg->reward().reward_model()));
  }
  if (cfg->reward().reward_model_weight() != 0) {
    co.reward_args.push_back(absl::StrCat("--reward_model_weight=", cfg->reward().reward_model_weight()));
  }
  co.learner_args = {absl::StrCat("--threads=", threads > 0 ? threads : std::max(1, cores / co.learners)),
                     LearnerWriteRoots(run_dir, cfg)};
  // Several learner shards on this host's GPUs: one each, from
  // model.device on (the workers' device was taken from model.device above).
  // Slurm steps see the GPUs their allocation binds.
  if (!on_slurm) co.learner_gpus = PlaceLearnerShardsOnGpus(cfg);
  if (cfg->learner().cuda_memory_fraction() > 0) {
    co.learner_args.push_back(absl::StrCat("--cuda_memory_fraction=", cfg->learner().cuda_memory_fraction()));
  }
  // environment.launch: the built-in environment server beside the roles.
  if (cfg->environment().launch()) {
    if (on_slurm) {
      return absl::UnimplementedError(
          "environment.launch: on Slurm the environment server is not placed by rlmesh; start "
          "one and give environment.address");
    }
    co.environment_servers = 1;
  }
  return co;
}

// --profile: every role writes its trace under <run dir>/profile, this
// process too.
absl::Status StartProfile(const std::string& run_dir, ClusterOptions* co) {
  co->trace_dir = run_dir + "/profile";
  std::error_code ec;
  std::filesystem::create_directories(co->trace_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", co->trace_dir));
  EnableTracing(co->trace_dir + "/coordinator.json", "coordinator");
  return absl::OkStatus();
}

// Starts the roles as this host's children. With environment.launch the
// experiment names the server started from here on, as if the user had
// (launch and address together are refused at load).
absl::StatusOr<std::unique_ptr<Cluster>> LaunchLocalRoles(const ClusterOptions& co, ExperimentConfig* cfg) {
  RLMESH_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> local, Cluster::Launch(co));
  if (cfg->environment().launch()) {
    cfg->mutable_environment()->set_address(local->Address(ROLE_ENVIRONMENT));
    cfg->mutable_environment()->set_launch(false);
    std::printf("rlmesh: environment server at %s\n", cfg->environment().address().c_str());
  }
  return local;
}

// Starts the roles as steps of a Slurm job that register with `server`,
// and checks that the weight-sync backend suits where they landed. On
// failure `server` is shut down (and the job stopped) before returning.
absl::StatusOr<std::unique_ptr<SlurmCluster>> LaunchSlurmRoles(const SlurmOptions& so, const ExperimentConfig& cfg,
                                                               Registry* registry, RpcServer* server) {
  auto launched = SlurmCluster::Launch(so, registry);
  if (!launched.ok()) {
    server->Shutdown();
    return launched.status();
  }
  std::unique_ptr<SlurmCluster> slurm = std::move(*launched);
  std::printf("rlmesh: roles running as steps of slurm job %s\n", slurm->job_id().c_str());
  absl::Status placed = CheckWeightSyncPlacement(cfg.weight_sync().backend(), registry->Roles());
  if (!placed.ok()) {
    server->Shutdown();
    slurm->Stop();
    return placed;
  }
  return slurm;
}

// The runner's options: the experiment, where its roles are (`a`; a local
// cluster's leaves the weight-sync store on this host) and what it is to do
// (resume, or evaluate `eval_folder` instead of the stages).
RunnerOptions RunRunnerOptions(const RunTarget& t, const ClusterAddresses& a, bool resume,
                               const std::string& eval_folder) {
  RunnerOptions ro = RunnerOptionsFor(t.cfg, t.id, t.run_dir, a);
  ro.resume = resume;
  ro.evaluate_folder = eval_folder;
  ro.eval_samples = UserPath(absl::GetFlag(FLAGS_out));
  return ro;
}

// What a run serves beside its RPCs: Prometheus metrics
// (logging.prometheus_port), the hang watch (logging.hang_dump_seconds) and
// the dashboard (--dashboard_port), all over `runner`'s one experiment.
absl::Status StartRunServices(ExperimentRunner* runner, const RunTarget& t, std::function<std::vector<RoleInfo>()> roles,
                              const ClusterAddresses& a, const std::string& tokenizer, const ServerOptions& server,
                              ClusterServices* out) {
  const ExperimentConfig& cfg = t.cfg;
  if (cfg.logging().prometheus_port() >= 0) {
    RLMESH_ASSIGN_OR_RETURN(
        out->metrics, MetricsHttpServer::Start(server.bind_address, cfg.logging().prometheus_port(),
                                               [runner] { return std::vector<ExperimentStatus>{runner->status()}; }));
    std::printf("rlmesh: metrics on http://%s:%d/metrics\n", server.bind_address.c_str(), out->metrics->port());
  }
  out->hang_watch = StartHangWatch(cfg.logging().hang_dump_seconds(), t.run_dir + "/hangs",
                                   [runner] { return std::optional<ExperimentStatus>(runner->status()); }, roles);
  ClusterAddresses dashboard_addresses = a;
  dashboard_addresses.tokenizer = tokenizer;
  RLMESH_ASSIGN_OR_RETURN(out->dashboard,
                          StartDashboard([runner] { return std::vector<ExperimentStatus>{runner->status()}; }, roles,
                                         dashboard_addresses, server, &out->dashboard_source));
  return absl::OkStatus();
}

// Runs the experiment to its end; SIGINT/SIGTERM cancel it at the next step
// boundary.
absl::Status FollowRun(ExperimentRunner* runner) {
  std::atomic<bool> finished{false};
  std::thread signals([&] {
    WaitForTerminationSignal();
    if (!finished.load()) {
      std::fprintf(stderr, "rlmesh: cancelling (signal)\n");
      runner->Cancel();
    }
  });
  absl::Status s = runner->Run();
  finished.store(true);
  ::kill(::getpid(), SIGTERM);  // wakes the signal thread
  signals.join();
  return s;
}

}  // namespace

// The steps: resolve the experiment and its folder, save it, build the
// cluster's options, start the roles and the RPC server, start the runner
// with its side services, follow it, and stop everything in reverse.
int Run(const std::vector<std::string>& args, const std::vector<std::string>& sets, const std::string& eval_folder) {
  const char* const command = eval_folder.empty() ? "run" : "eval";
  const std::string resume = UserPath(absl::GetFlag(FLAGS_resume));
  // --dry-run prints what would be submitted to Slurm and touches nothing.
  const bool dry_run = absl::GetFlag(FLAGS_dry_run);
  const bool on_slurm = !absl::GetFlag(FLAGS_cluster).empty();
  // A local run's dry run is its memory plan.
  if (dry_run && !on_slurm) {
    if (args.size() != 1) return Fail(command, absl::InvalidArgumentError("expected one experiment YAML"));
    auto cfg = LoadExperiment(args[0], sets);
    if (!cfg.ok()) return Fail(command, cfg.status());
    return PrintPlan(command, *cfg);
  }
  auto target = ResolveRun(args, sets, resume, eval_folder);
  if (!target.ok()) return Fail(command, target.status());
  ExperimentConfig& cfg = target->cfg;
  const std::string& id = target->id;
  const std::string& run_dir = target->run_dir;
  if (resume.empty() && !dry_run) {
    absl::Status saved = SaveExperiment(args[0], sets, run_dir);
    if (!saved.ok()) return Fail(command, saved);
  }
  ClusterConfig slurm_config;
  if (on_slurm) {
    auto loaded = LoadSlurmCluster();
    if (!loaded.ok()) return Fail(command, loaded.status());
    slurm_config = *loaded;
  }
  auto cluster_options = RunClusterOptions(&cfg, run_dir, on_slurm);
  if (!cluster_options.ok()) return Fail(command, cluster_options.status());
  ClusterOptions& co = *cluster_options;
  const bool profile = absl::GetFlag(FLAGS_profile) && !dry_run;
  if (profile) {
    absl::Status started = StartProfile(run_dir, &co);
    if (!started.ok()) return Fail(command, started);
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

  // The roles (local children now, Slurm steps once the server is up) and
  // the Coordinator RPC.
  std::unique_ptr<Cluster> local;
  if (!on_slurm) {
    auto cluster = LaunchLocalRoles(co, &cfg);
    if (!cluster.ok()) return Fail(command, cluster.status());
    local = std::move(*cluster);
  }
  Registry registry(RegistryOptionsFromFlags());
  RpcServer server(*server_options);
  CoordinatorServiceImpl service(&server.auth(), local.get(), nullptr, &registry);
  server.AddService(&service);
  absl::Status started = server.Start();
  if (!started.ok()) return Fail(command, started);
  std::unique_ptr<SlurmCluster> slurm;
  if (on_slurm) {
    auto launched =
        LaunchSlurmRoles(SlurmOptionsFor(co, slurm_config, job_name, server.address()), cfg, &registry, &server);
    if (!launched.ok()) return Fail(command, launched.status());
    slurm = std::move(*launched);
  }

  // The runner and what serves its status.
  const ClusterAddresses a = local ? AddressesOf(*local, server_options->auth_token, run_dir)
                                   : AddressesOf(*slurm, server_options->auth_token, co.tokenizer, run_dir);
  ExperimentRunner runner(RunRunnerOptions(*target, a, !resume.empty(), eval_folder));
  // Roles as the launcher sees them: the local cluster's children, or what
  // registered from the Slurm steps.
  std::function<std::vector<RoleInfo>()> roles = [&local, &registry] {
    return local ? local->Roles() : registry.Roles();
  };
  ClusterServices services;
  absl::Status serving = StartRunServices(&runner, *target, roles, a, co.tokenizer, *server_options, &services);
  if (!serving.ok()) return Fail(command, serving);
  std::printf("rlmesh: cluster up (coordinator %s); experiment %s\n", server.address().c_str(), id.c_str());
  std::printf("rlmesh: query it with: bazel-bin/replay_buffer/cli query --address %s --experiment %s --limit 5\n",
              a.replay_buffer.c_str(), id.c_str());
  std::fflush(stdout);

  absl::Status s = FollowRun(&runner);
  server.Shutdown();
  if (local) local->Stop();  // the roles write their traces as they stop
  if (slurm) slurm->Stop();
  if (profile) WriteProfile(co.trace_dir, run_dir + "/profile.json");
  if (!s.ok()) return Fail(command, s);
  return 0;
}

}  // namespace rlmesh
