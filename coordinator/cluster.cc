#include "coordinator/cluster.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/device_spec.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace rlmesh {

int GpuOf(const ClusterOptions& options, Role role, int index) {
  const std::vector<int>* gpus = nullptr;
  switch (role) {
    case ROLE_LEARNER: gpus = &options.learner_gpus; break;
    case ROLE_ROLLOUT_WORKER: gpus = &options.rollout_gpus; break;
    case ROLE_REWARD_SERVER: gpus = &options.reward_gpus; break;
    default: return -1;
  }
  if (gpus->empty()) return -1;
  return (*gpus)[index % gpus->size()];
}

absl::Status ClusterOptions::ValidateGpus() const {
  struct Use {
    Role role;
    std::string name;
  };
  std::map<int, std::vector<Use>> by_gpu;
  std::map<int, double> fraction_of_gpu;
  const struct {
    Role role;
    const char* field;
    const char* prefix;
    int count;
    const std::vector<int>* gpus;
    double fraction;
    const char* fraction_field;
  } roles[] = {{ROLE_LEARNER, "gpus.learner", "learner-", learners, &learner_gpus, learner_memory_fraction,
                "gpus.learner_memory_fraction"},
               {ROLE_ROLLOUT_WORKER, "gpus.rollout_worker", "rollout-", rollout_workers, &rollout_gpus,
                rollout_memory_fraction, "gpus.rollout_worker_memory_fraction"},
               {ROLE_REWARD_SERVER, "gpus.reward_server", "reward-", reward_servers, &reward_gpus,
                reward_memory_fraction, "gpus.reward_server_memory_fraction"}};
  for (const auto& r : roles) {
    if (!(r.fraction >= 0 && r.fraction <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(r.fraction_field, ": ", r.fraction, " is not in [0, 1]"));
    }
    if (r.fraction > 0 && r.gpus->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.fraction_field, ": set but ", r.field, " is empty (the role computes on the CPU)"));
    }
    for (size_t i = 0; i < r.gpus->size(); ++i) {
      const int g = (*r.gpus)[i];
      if (g < 0 || g >= kMaxCudaDevices) {
        return absl::InvalidArgumentError(
            absl::StrCat(r.field, "[", i, "]: ", g, " is not a GPU index in [0, ", kMaxCudaDevices - 1, "]"));
      }
    }
    if (r.gpus->empty()) continue;
    for (int i = 0; i < r.count; ++i) {
      const int gpu = GpuOf(*this, r.role, i);
      by_gpu[gpu].push_back({r.role, absl::StrCat(r.prefix, i)});
      fraction_of_gpu[gpu] += r.fraction;
    }
  }
  for (const auto& [gpu, sum] : fraction_of_gpu) {
    if (sum > 1 + 1e-9) {
      return absl::InvalidArgumentError(absl::StrCat("gpus: the memory fractions of the processes on GPU ", gpu,
                                                     " sum to ", sum, " > 1 (gpus.*_memory_fraction)"));
    }
  }
  for (const auto& [gpu, uses] : by_gpu) {
    for (size_t a = 0; a < uses.size(); ++a) {
      for (size_t b = a + 1; b < uses.size(); ++b) {
        if (uses[a].role == uses[b].role) {
          return absl::InvalidArgumentError(absl::StrCat("gpus: ", uses[a].name, " and ", uses[b].name,
                                                         " would share GPU ", gpu,
                                                         " (one GPU per process of a role; NCCL refuses two ranks "
                                                         "on one device)"));
        }
        if (!colocate_gpus) {
          return absl::InvalidArgumentError(absl::StrCat("gpus: ", uses[a].name, " and ", uses[b].name,
                                                         " would share GPU ", gpu,
                                                         "; set gpus.colocate: true to colocate them"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ClusterOptions::Validate() const {
  if (bin_dir.empty()) return absl::InvalidArgumentError("bin_dir: empty");
  if (run_dir.empty()) return absl::InvalidArgumentError("run_dir: empty");
  if (rollout_workers < 0 || rollout_workers > 64) {
    return absl::InvalidArgumentError(absl::StrCat("rollout_workers: ", rollout_workers, " not in [0, 64]"));
  }
  if (reward_servers < 0 || reward_servers > 64) {
    return absl::InvalidArgumentError(absl::StrCat("reward_servers: ", reward_servers, " not in [0, 64]"));
  }
  if (learners < 0 || learners > 64) {
    return absl::InvalidArgumentError(absl::StrCat("learners: ", learners, " not in [0, 64]"));
  }
  if (environment_servers < 0 || environment_servers > 64) {
    return absl::InvalidArgumentError(absl::StrCat("environment_servers: ", environment_servers, " not in [0, 64]"));
  }
  RLMESH_RETURN_IF_ERROR(ValidateGpus());
  std::vector<Role> needed = {ROLE_ROLLOUT_WORKER, ROLE_REWARD_SERVER, ROLE_REPLAY_BUFFER, ROLE_LEARNER};
  if (environment_servers > 0) needed.push_back(ROLE_ENVIRONMENT);
  for (Role r : needed) {
    const std::string bin = RoleBinary(bin_dir, r);
    if (::access(bin.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("role binary not found: ", bin,
                                              " (build //... first, or pass --bin_dir)"));
    }
  }
  return absl::OkStatus();
}

ClusterOptions ClusterOptionsFromConfig(const ClusterConfig& config, const std::string& bin_dir,
                                        const std::string& run_dir) {
  ClusterOptions o;
  o.bin_dir = bin_dir;
  o.run_dir = run_dir;
  if (!config.bind().empty()) o.bind = config.bind();
  o.rollout_workers = config.rollout_workers() > 0 ? config.rollout_workers() : 1;
  o.reward_servers = config.reward_servers() > 0 ? config.reward_servers() : 1;
  o.learners = config.learners() > 0 ? config.learners() : 1;
  o.auth_token_file = config.auth_token_file();
  o.buffer_path = config.buffer_path();
  if (!config.tokenizer().empty()) o.tokenizer = config.tokenizer();
  o.learner_gpus.assign(config.gpus().learner().begin(), config.gpus().learner().end());
  o.rollout_gpus.assign(config.gpus().rollout_worker().begin(), config.gpus().rollout_worker().end());
  o.reward_gpus.assign(config.gpus().reward_server().begin(), config.gpus().reward_server().end());
  o.colocate_gpus = config.gpus().colocate();
  o.learner_memory_fraction = config.gpus().learner_memory_fraction();
  o.rollout_memory_fraction = config.gpus().rollout_worker_memory_fraction();
  o.reward_memory_fraction = config.gpus().reward_server_memory_fraction();
  o.rollout_args.push_back("--tokenizer=" + o.tokenizer);
  o.reward_args.push_back("--tokenizer=" + o.tokenizer);
  return o;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Launch(ClusterOptions options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  std::error_code ec;
  std::filesystem::create_directories(options.run_dir + "/logs", ec);
  std::filesystem::create_directories(options.run_dir + "/ports", ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", options.run_dir, ": ", ec.message()));
  if (options.buffer_path.empty()) options.buffer_path = options.run_dir + "/replay_buffer";

  std::unique_ptr<Cluster> cluster(new Cluster(std::move(options)));
  const ClusterOptions& o = cluster->options_;
  RLMESH_ASSIGN_OR_RETURN(cluster->token_, ReadTokenFile(o.auth_token_file));
  absl::Status started = absl::OkStatus();
  {
    absl::MutexLock lock(&cluster->mu_);
    auto add = [&](Role role, const std::string& name, std::vector<std::string> extra)
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(cluster->mu_) {
      auto m = std::make_unique<Member>();
      m->name = name;
      m->role = role;
      m->extra_args = std::move(extra);
      int index = 0;
      for (const auto& other : cluster->members_) index += other->role == role ? 1 : 0;
      m->gpu = GpuOf(o, role, index);
      // After the role's own flags: the placement decides the device, and
      // the GPU's share this process may hold.
      if (m->gpu >= 0) {
        m->extra_args.push_back("--device=cuda");
        const double fraction = role == ROLE_LEARNER           ? o.learner_memory_fraction
                                : role == ROLE_ROLLOUT_WORKER ? o.rollout_memory_fraction
                                : role == ROLE_REWARD_SERVER  ? o.reward_memory_fraction
                                                              : 0;
        if (fraction > 0) m->extra_args.push_back(absl::StrCat("--cuda_memory_fraction=", fraction));
      }
      cluster->members_.push_back(std::move(m));
    };
    add(ROLE_REPLAY_BUFFER, "replay_buffer", {"--db_path=" + o.buffer_path});
    for (int i = 0; i < o.reward_servers; ++i) add(ROLE_REWARD_SERVER, absl::StrCat("reward-", i), o.reward_args);
    for (int i = 0; i < o.environment_servers; ++i) {
      add(ROLE_ENVIRONMENT, absl::StrCat("environment-", i), o.environment_args);
    }
    for (int i = 0; i < o.rollout_workers; ++i) {
      std::vector<std::string> args = o.rollout_args;
      if (o.wire_roles) args.push_back(absl::StrCat("--name=rollout-", i));
      add(ROLE_ROLLOUT_WORKER, absl::StrCat("rollout-", i), args);
    }
    for (int i = 0; i < o.learners; ++i) {
      std::vector<std::string> args = o.learner_args;
      if (o.wire_roles) args.push_back(absl::StrCat("--name=learner-", i));
      add(ROLE_LEARNER, absl::StrCat("learner-", i), args);
    }
    for (auto& m : cluster->members_) {
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

absl::Status Cluster::StartMember(Member* m) {
  const std::string port_file = absl::StrCat(options_.run_dir, "/ports/", m->name, ".port");
  const std::string log = absl::StrCat(options_.run_dir, "/logs/", m->name, ".log");
  std::remove(port_file.c_str());
  std::vector<std::string> argv = {RoleBinary(options_.bin_dir, m->role),
                                   absl::StrCat("--port=", m->port),
                                   "--port_file=" + port_file,
                                   "--bind=" + options_.bind};
  if (!options_.auth_token_file.empty()) argv.push_back("--auth_token_file=" + options_.auth_token_file);
  for (const auto& a : options_.role_args) argv.push_back(a);
  for (const auto& a : m->extra_args) argv.push_back(a);
  if (!options_.trace_dir.empty()) argv.push_back("--trace_file=" + options_.trace_dir + "/" + m->name + ".json");
  if (options_.wire_roles && m->role == ROLE_ROLLOUT_WORKER) {
    // Started after the buffer and the reward servers, so their ports are known.
    int index = 0, seen = 0;
    for (auto& other : members_) {
      if (other.get() == m) index = seen;
      if (other->role == ROLE_ROLLOUT_WORKER) ++seen;
    }
    argv.push_back("--replay_buffer=" + AddressLocked(ROLE_REPLAY_BUFFER, 0));
    argv.push_back("--reward_server=" + AddressLocked(ROLE_REWARD_SERVER, index % std::max(1, options_.reward_servers)));
  }
  std::vector<std::string> env;
  if (m->gpu >= 0) env.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", m->gpu));
  RLMESH_ASSIGN_OR_RETURN(Subprocess proc, Subprocess::Start(argv, log, env));
  m->process = std::make_unique<Subprocess>(std::move(proc));
  // Poll the port file, but give up at once if the role exits (a bad flag or
  // a port in use should not cost the whole start timeout).
  absl::StatusOr<int> port = absl::DeadlineExceededError("not started");
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  while (absl::Now() < deadline && m->process->running()) {
    port = ReadPortFile(port_file, absl::Milliseconds(100));
    if (port.ok()) break;
  }
  if (!port.ok()) {
    return absl::UnavailableError(absl::StrCat(m->name, " did not start (",
                                               m->process->running() ? "no port reported" : "exited",
                                               "); see ", log));
  }
  m->port = *port;
  ClientOptions copts;
  copts.auth_token = token_;
  RLMESH_ASSIGN_OR_RETURN(RpcClient client,
                          RpcClient::Create(absl::StrCat(options_.bind, ":", m->port), copts));
  m->client = std::make_unique<RpcClient>(std::move(client));
  absl::Status serving = WaitUntilServing(*m->client, options_.start_timeout);
  if (!serving.ok()) {
    return absl::UnavailableError(absl::StrCat(m->name, " is not serving: ", serving.message(), "; see ", log));
  }
  RLMESH_LOG(INFO) << "started role=" << m->name << " pid=" << m->process->pid() << " port=" << m->port
                   << (m->gpu >= 0 ? absl::StrCat(" gpu=", m->gpu) : "");
  return absl::OkStatus();
}

void Cluster::Monitor() {
  while (!stopping_.load()) {
    absl::SleepFor(options_.monitor_period);
    if (stopping_.load() || !options_.restart_dead) continue;
    absl::MutexLock lock(&mu_);
    for (auto& m : members_) {
      if (stopping_.load()) break;
      if (m->process != nullptr && !m->process->running()) {
        auto st = m->process->Wait(absl::ZeroDuration());
        RLMESH_LOG(WARNING) << "role=" << m->name << " died ("
                            << (st.ok() ? DescribeWaitStatus(*st) : "unknown") << "); restarting on port "
                            << m->port;
        ++m->restarts;
        absl::Status s = StartMember(m.get());
        if (!s.ok()) RLMESH_LOG(ERROR) << "restart failed role=" << m->name << ": " << s.message();
      }
    }
  }
}

std::vector<RoleInfo> Cluster::Roles() {
  absl::MutexLock lock(&mu_);
  std::vector<RoleInfo> out;
  for (auto& m : members_) {
    RoleInfo info;
    info.set_name(m->name);
    info.set_role(m->role);
    info.set_address(absl::StrCat(options_.bind, ":", m->port));
    info.set_pid(m->process ? m->process->pid() : 0);
    info.set_restarts(m->restarts);
    if (m->process == nullptr || !m->process->running()) {
      info.set_health("DEAD");
    } else {
      auto h = CheckHealth(*m->client, absl::Seconds(2));
      info.set_health(h.ok() ? *h : "UNKNOWN");
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::string Cluster::Address(Role role, int index) {
  absl::MutexLock lock(&mu_);
  return AddressLocked(role, index);
}

std::vector<std::string> Cluster::Addresses(Role role) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (auto& m : members_) {
    if (m->role == role) out.push_back(absl::StrCat(options_.bind, ":", m->port));
  }
  return out;
}

std::string Cluster::AddressLocked(Role role, int index) {
  int seen = 0;
  for (auto& m : members_) {
    if (m->role == role && seen++ == index) return absl::StrCat(options_.bind, ":", m->port);
  }
  return "";
}

void Cluster::Stop(absl::Duration grace) {
  stopping_.store(true);
  if (monitor_.joinable()) monitor_.join();
  absl::MutexLock lock(&mu_);
  // Reverse start order: learners and workers before the buffer they write to.
  for (auto it = members_.rbegin(); it != members_.rend(); ++it) {
    if ((*it)->process) (*it)->process->Signal(SIGTERM);
  }
  const absl::Time deadline = absl::Now() + grace;
  for (auto it = members_.rbegin(); it != members_.rend(); ++it) {
    auto& p = (*it)->process;
    if (!p) continue;
    auto st = p->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!st.ok()) {
      RLMESH_LOG(WARNING) << "role=" << (*it)->name << " ignored SIGTERM; killing";
      p->Stop(absl::ZeroDuration());
    } else if (*st != 0) {
      RLMESH_LOG(WARNING) << "role=" << (*it)->name << " stopped with " << DescribeWaitStatus(*st);
    }
  }
}

Cluster::~Cluster() { Stop(absl::Seconds(2)); }

}  // namespace rlmesh
