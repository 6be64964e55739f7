#include "coordinator/slurm_launcher.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/atomic_file.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace rlmesh {
namespace {

// argv[0] as a path: itself if it has a '/', else the first match on $PATH.
std::string FindInPath(const std::string& command) {
  if (command.find('/') != std::string::npos) return command;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/", command);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Quotes one word for a shell comment a user may copy.
std::string ShellQuote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.,:/=@%+") ==
                        std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

int NodeOf(const std::vector<int>& nodes, int index) {
  return nodes.empty() ? 0 : nodes[index % nodes.size()];
}

std::string PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? "" : address.substr(colon + 1);
}

}  // namespace

absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv, absl::Duration timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("empty command");
  SubprocessOptions o;
  o.argv = argv;
  o.stdin_stream = Stdio::DevNull();
  o.stdout_stream = Stdio::Pipe();
  o.stderr_stream = Stdio::Pipe();
  RLMESH_ASSIGN_OR_RETURN(RunResult r, Run(o, "", absl::Now() + timeout));
  if (r.timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(absl::StrJoin(argv, " "), ": no answer within ",
                                                    absl::FormatDuration(timeout)));
  }
  if (!r.success()) {
    return absl::UnavailableError(
        absl::StrCat(argv[0], " failed (", DescribeWaitStatus(r.wait_status), "): ",
                     absl::StripAsciiWhitespace(r.stderr_text.empty() ? r.stdout_text : r.stderr_text)));
  }
  return r.stdout_text;
}

absl::Status CheckWeightSyncPlacement(WeightSyncBackend backend, const std::vector<RoleInfo>& roles) {
  if (backend != WEIGHT_SYNC_SHM) return absl::OkStatus();
  const RoleInfo* publisher = nullptr;
  for (const auto& r : roles) {
    if (r.role() == ROLE_LEARNER && (publisher == nullptr || r.name() < publisher->name())) publisher = &r;
  }
  if (publisher == nullptr) return absl::OkStatus();
  for (const auto& r : roles) {
    if (r.role() != ROLE_ROLLOUT_WORKER || r.host() == publisher->host()) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "weight_sync.backend: shm needs the publisher and its receivers on one host, but ", publisher->name(),
        " is on ", publisher->host().empty() ? "?" : publisher->host(), " and ", r.name(), " on ",
        r.host().empty() ? "?" : r.host(), "; use gloo (or auto) across hosts"));
  }
  return absl::OkStatus();
}

absl::Status SlurmOptions::Validate() const {
  RLMESH_RETURN_IF_ERROR(cluster.Validate());
  if (coordinator_address.empty()) return absl::InvalidArgumentError("slurm.coordinator_address: empty");
  const std::string host = coordinator_address.substr(0, coordinator_address.rfind(':'));
  if (coordinator_address.find(':') == std::string::npos || PortOf(coordinator_address).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slurm.coordinator_address: '", coordinator_address, "' is not host:port"));
  }
  if (host == "0.0.0.0" || host == "127.0.0.1" || host == "localhost" || host == "::" || host == "[::]" ||
      host == "[::1]") {
    return absl::InvalidArgumentError(absl::StrCat("slurm.coordinator_address: '", coordinator_address,
                                                   "' is not reachable from other nodes; bind the coordinator "
                                                   "to an interface (--bind) or set slurm.coordinator_address"));
  }
  if (job_name.empty() || job_name.find_first_of(" \t\n'\"$`\\") != std::string::npos) {
    return absl::InvalidArgumentError("slurm.job_name: empty or has spaces/quotes");
  }
  if (nodes < 0) return absl::InvalidArgumentError(absl::StrCat("slurm.nodes: ", nodes, " < 0"));
  for (const auto* list : {&replay_buffer_nodes, &reward_server_nodes, &rollout_worker_nodes, &learner_nodes}) {
    for (int n : *list) {
      if (n < 0 || (nodes > 0 && n >= nodes)) {
        return absl::InvalidArgumentError(
            absl::StrCat("slurm.*_nodes: node index ", n, " outside the allocation of ", nodes, " node(s)"));
      }
    }
  }
  for (const std::string* s : {&partition, &time_limit, &network_interface}) {
    if (s->find_first_of(" \t\n'\"$`\\;") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("slurm: '", *s, "' has spaces or shell characters"));
    }
  }
  if (start_timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("slurm.start_timeout: not positive");
  return absl::OkStatus();
}

SlurmOptions SlurmOptionsFromConfig(const ClusterOptions& cluster, const SlurmConfig& slurm,
                                    const std::string& job_name) {
  SlurmOptions o;
  o.cluster = cluster;
  // Roles serve other nodes: bind every interface, advertise the right one.
  o.cluster.bind = "0.0.0.0";
  o.job_name = job_name;
  o.partition = slurm.partition();
  o.nodes = slurm.nodes();
  o.time_limit = slurm.time_limit();
  o.sbatch_args.assign(slurm.sbatch_args().begin(), slurm.sbatch_args().end());
  o.replay_buffer_nodes.assign(slurm.replay_buffer_nodes().begin(), slurm.replay_buffer_nodes().end());
  o.reward_server_nodes.assign(slurm.reward_server_nodes().begin(), slurm.reward_server_nodes().end());
  o.rollout_worker_nodes.assign(slurm.rollout_worker_nodes().begin(), slurm.rollout_worker_nodes().end());
  o.learner_nodes.assign(slurm.learner_nodes().begin(), slurm.learner_nodes().end());
  o.coordinator_address = slurm.coordinator_address();
  o.network_interface = slurm.network_interface();
  if (slurm.start_timeout_seconds() > 0) o.start_timeout = absl::Seconds(slurm.start_timeout_seconds());
  return o;
}

std::vector<SlurmStep> PlanSteps(const SlurmOptions& o) {
  std::vector<SlurmStep> steps;
  const ClusterOptions& c = o.cluster;
  const std::string buffer = c.buffer_path.empty() ? c.run_dir + "/replay_buffer" : c.buffer_path;
  steps.push_back({"replay_buffer", ROLE_REPLAY_BUFFER, NodeOf(o.replay_buffer_nodes, 0), {"--db_path=" + buffer}});
  for (int i = 0; i < c.reward_servers; ++i) {
    steps.push_back({absl::StrCat("reward-", i), ROLE_REWARD_SERVER, NodeOf(o.reward_server_nodes, i), c.reward_args});
  }
  for (int i = 0; i < c.rollout_workers; ++i) {
    SlurmStep s{absl::StrCat("rollout-", i), ROLE_ROLLOUT_WORKER, NodeOf(o.rollout_worker_nodes, i), c.rollout_args};
    s.role_args.push_back(absl::StrCat("--name=rollout-", i));
    steps.push_back(std::move(s));
  }
  for (int i = 0; i < c.learners; ++i) {
    SlurmStep s{absl::StrCat("learner-", i), ROLE_LEARNER, NodeOf(o.learner_nodes, i), c.learner_args};
    s.role_args.push_back(absl::StrCat("--name=learner-", i));
    steps.push_back(std::move(s));
  }
  return steps;
}

namespace {
int NodesNeeded(const SlurmOptions& o) {
  if (o.nodes > 0) return o.nodes;
  int highest = 0;
  for (const auto& s : PlanSteps(o)) highest = std::max(highest, s.node);
  return highest + 1;
}
}  // namespace

std::vector<std::string> StepCommand(const SlurmOptions& o, const std::string& job_id, const SlurmStep& step,
                                     int port, const std::vector<std::string>& wiring) {
  std::vector<std::string> argv = {o.srun,
                                   "--jobid=" + job_id,
                                   "--job-name=" + step.name,
                                   "--nodes=1",
                                   "--ntasks=1",
                                   absl::StrCat("--relative=", step.node),
                                   // Steps share the allocation's CPUs with
                                   // each other and the batch step.
                                   "--overlap",
                                   "--kill-on-bad-exit=1",
                                   "--unbuffered"};
  argv.push_back(o.network_interface.empty() ? "--export=ALL"
                                             : "--export=ALL,GLOO_SOCKET_IFNAME=" + o.network_interface);
  RoleCommand role;
  role.bin_dir = o.cluster.bin_dir;
  role.role = step.role;
  role.port = port;
  role.bind = o.cluster.bind;
  role.coordinator = o.coordinator_address;
  role.instance_name = step.name;
  role.advertise_interface = o.network_interface;
  role.auth_token_file = o.cluster.auth_token_file;
  role.common_args = o.cluster.role_args;
  role.role_args = step.role_args;
  role.wiring = wiring;
  for (auto& a : RoleArgv(role)) argv.push_back(std::move(a));
  return argv;
}

std::string BatchScript(const SlurmOptions& o) {
  std::string s = "#!/bin/bash\n";
  absl::StrAppend(&s, "#SBATCH --job-name=", o.job_name, "\n");
  absl::StrAppend(&s, "#SBATCH --nodes=", NodesNeeded(o), "\n");
  absl::StrAppend(&s, "#SBATCH --ntasks-per-node=1\n");
  absl::StrAppend(&s, "#SBATCH --output=", o.cluster.run_dir, "/logs/slurm-%j.log\n");
  if (!o.partition.empty()) absl::StrAppend(&s, "#SBATCH --partition=", o.partition, "\n");
  if (!o.time_limit.empty()) absl::StrAppend(&s, "#SBATCH --time=", o.time_limit, "\n");
  for (const auto& a : o.sbatch_args) absl::StrAppend(&s, "#SBATCH ", a, "\n");
  absl::StrAppend(&s,
                  "#\n"
                  "# rlmesh: this job only holds the nodes. The coordinator (",
                  o.coordinator_address,
                  ") starts one step per role in it,\n"
                  "# restarts a step that ends, and cancels the job when the run ends:\n");
  for (const auto& step : PlanSteps(o)) {
    std::vector<std::string> wiring;
    if (step.role == ROLE_ROLLOUT_WORKER) {
      wiring = {"--replay_buffer=<replay_buffer address>", "--reward_server=<reward server address>"};
    }
    std::vector<std::string> words;
    for (const auto& w : StepCommand(o, "$SLURM_JOB_ID", step, 0, wiring)) words.push_back(ShellQuote(w));
    absl::StrAppend(&s, "#   ", absl::StrJoin(words, " "), "\n");
  }
  absl::StrAppend(&s,
                  "echo \"rlmesh: allocation $SLURM_JOB_ID on $SLURM_JOB_NODELIST\"\n"
                  "exec sleep infinity\n");
  return s;
}

absl::StatusOr<std::unique_ptr<SlurmCluster>> SlurmCluster::Launch(SlurmOptions options, Registry* registry) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  const std::string srun = FindInPath(options.srun);
  if (srun.empty()) return absl::NotFoundError(absl::StrCat(options.srun, ": not found on PATH (install slurm-client)"));
  options.srun = srun;
  std::error_code ec;
  std::filesystem::create_directories(options.cluster.run_dir + "/logs", ec);
  std::filesystem::create_directories(options.cluster.run_dir + "/slurm", ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", options.cluster.run_dir, ": ", ec.message()));
  const std::string script_path = options.cluster.run_dir + "/slurm/allocation.sbatch";
  RLMESH_RETURN_IF_ERROR(WriteFileAtomically(script_path, BatchScript(options)));
  RLMESH_ASSIGN_OR_RETURN(std::string out,
                          RunCommand({options.sbatch, "--parsable", script_path}, absl::Seconds(60)));
  std::string job_id(absl::StripAsciiWhitespace(out));
  job_id = job_id.substr(0, job_id.find(';'));  // "id;cluster" on a federation
  if (job_id.empty() || job_id.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InternalError(absl::StrCat("sbatch printed no job id: '", out, "'"));
  }
  RLMESH_LOG(INFO) << "slurm job=" << job_id << " submitted (" << script_path << ")";
  std::unique_ptr<SlurmCluster> cluster(new SlurmCluster(std::move(options), registry, job_id));
  const SlurmOptions& o = cluster->options_;

  // Wait for the allocation.
  const absl::Time queue_deadline = absl::Now() + o.queue_timeout;
  std::string state;
  while (true) {
    auto st = RunCommand({o.squeue, "-h", "-j", job_id, "-o", "%T"}, absl::Seconds(30));
    state = st.ok() ? std::string(absl::StripAsciiWhitespace(*st)) : "";
    if (state == "RUNNING") break;
    if (!state.empty() && state != "PENDING" && state != "CONFIGURING") {
      cluster->Stop(absl::Seconds(1));
      return absl::UnavailableError(absl::StrCat("slurm job ", job_id, " is ", state, "; see ", o.cluster.run_dir,
                                                 "/logs/slurm-", job_id, ".log"));
    }
    if (absl::Now() > queue_deadline) {
      cluster->Stop(absl::Seconds(1));
      return absl::DeadlineExceededError(absl::StrCat("slurm job ", job_id, " still ", state.empty() ? "unknown" : state,
                                                      " after ", absl::FormatDuration(o.queue_timeout),
                                                      " (squeue -j ", job_id, " says why)"));
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  RLMESH_LOG(INFO) << "slurm job=" << job_id << " running";

  absl::Status started = absl::OkStatus();
  {
    absl::MutexLock lock(&cluster->mu_);
    for (auto& step : PlanSteps(o)) {
      auto m = std::make_unique<Member>();
      m->step = std::move(step);
      cluster->members_.push_back(std::move(m));
    }
    // Rollout workers need the buffer's and their reward server's address,
    // so the steps start one after the other in plan order.
    for (auto& m : cluster->members_) {
      if (m->step.role == ROLE_ROLLOUT_WORKER) {
        std::string buffer, reward;
        int index = 0, seen = 0;
        std::vector<std::string> rewards;
        for (auto& other : cluster->members_) {
          if (other.get() == m.get()) index = seen;
          if (other->step.role == ROLE_ROLLOUT_WORKER) ++seen;
          if (other->step.role == ROLE_REPLAY_BUFFER) buffer = other->address;
          if (other->step.role == ROLE_REWARD_SERVER) rewards.push_back(other->address);
        }
        m->wiring = {"--replay_buffer=" + buffer};
        if (!rewards.empty()) m->wiring.push_back("--reward_server=" + rewards[index % rewards.size()]);
      }
      started = cluster->StartMember(m.get());
      if (!started.ok()) break;
    }
  }
  if (!started.ok()) {
    cluster->Stop(absl::Seconds(2));
    return started;
  }
  cluster->monitor_ = std::thread([c = cluster.get()] { c->Monitor(); });
  return cluster;
}

absl::Status SlurmCluster::StartMember(Member* m) {
  const std::string log = absl::StrCat(options_.cluster.run_dir, "/logs/", m->step.name, ".log");
  const int before = registry_->Registrations(m->step.name);
  const std::vector<std::string> argv = StepCommand(options_, job_id_, m->step, m->port, m->wiring);
  RLMESH_ASSIGN_OR_RETURN(Subprocess proc, Subprocess::Start(argv, log));
  m->srun = std::make_unique<Subprocess>(std::move(proc));
  // Wait for the role to register, but give up at once if its step ends.
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  absl::StatusOr<RoleInfo> info = absl::DeadlineExceededError("not started");
  while (absl::Now() < deadline && !stopping_.load()) {
    info = registry_->WaitFor(m->step.name, before, absl::Milliseconds(200));
    if (info.ok() || !m->srun->running()) break;
  }
  if (!info.ok()) {
    return absl::UnavailableError(absl::StrCat(m->step.name, " (slurm job ", job_id_, ", node index ", m->step.node,
                                               ") did not register with the coordinator at ",
                                               options_.coordinator_address, " (",
                                               m->srun->running() ? "step still running" : "step ended",
                                               "); see ", log));
  }
  m->address = info->address();
  m->port = std::atoi(PortOf(m->address).c_str());
  RLMESH_LOG(INFO) << "started role=" << m->step.name << " slurm_job=" << job_id_ << " node_index=" << m->step.node
                   << " host=" << info->host() << " address=" << m->address;
  return absl::OkStatus();
}

void SlurmCluster::Monitor() {
  while (!stopping_.load()) {
    absl::SleepFor(options_.monitor_period);
    if (stopping_.load() || !options_.cluster.restart_dead) continue;
    absl::MutexLock lock(&mu_);
    for (auto& m : members_) {
      if (stopping_.load()) break;
      if (m->srun == nullptr || m->srun->running()) continue;
      auto st = m->srun->Wait(absl::ZeroDuration());
      RLMESH_LOG(WARNING) << "role=" << m->step.name << " step ended ("
                          << (st.ok() ? DescribeWaitStatus(*st) : "unknown")
                          << "); starting a new step on node index " << m->step.node << " port " << m->port;
      ++m->restarts;
      const absl::Time start = absl::Now();
      absl::Status s = StartMember(m.get());
      if (!s.ok()) {
        RLMESH_LOG(ERROR) << "restart failed role=" << m->step.name << ": " << s.message();
        // A cancelled or expired allocation takes no new steps: say so once
        // and stop trying (the runner's calls then fail and the run ends).
        auto state = RunCommand({options_.squeue, "-h", "-j", job_id_, "-o", "%T"}, absl::Seconds(30));
        const std::string st = state.ok() ? std::string(absl::StripAsciiWhitespace(*state)) : "";
        if (st != "RUNNING") {
          RLMESH_LOG(ERROR) << "slurm job=" << job_id_ << " is " << (st.empty() ? "gone" : st)
                            << "; roles are no longer restarted (resume the run in a new allocation)";
          return;
        }
      } else {
        RLMESH_LOG(INFO) << "role=" << m->step.name << " back after " << absl::FormatDuration(absl::Now() - start);
      }
    }
  }
}

std::vector<std::string> SlurmCluster::Addresses(Role role) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (auto& m : members_) {
    if (m->step.role == role) out.push_back(m->address);
  }
  return out;
}

void SlurmCluster::Stop(absl::Duration grace) {
  if (stopping_.exchange(true)) {
    if (monitor_.joinable()) monitor_.join();
    return;
  }
  if (monitor_.joinable()) monitor_.join();
  auto cancelled = RunCommand({options_.scancel, job_id_}, absl::Seconds(30));
  if (!cancelled.ok()) RLMESH_LOG(WARNING) << "scancel job=" << job_id_ << ": " << cancelled.status().message();
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + grace;
  for (auto& m : members_) {
    if (!m->srun) continue;
    auto st = m->srun->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!st.ok()) m->srun->Stop(absl::Seconds(1));
  }
  RLMESH_LOG(INFO) << "slurm job=" << job_id_ << " cancelled";
}

SlurmCluster::~SlurmCluster() { Stop(absl::Seconds(2)); }

}  // namespace rlmesh
