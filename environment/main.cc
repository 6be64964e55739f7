// environment_server: the built-in environments (calculator tool,
// multi-step arithmetic) behind the EnvironmentService RPC.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "common/log.h"
#include "common/server_flags.h"
#include "environment/episode_table.h"
#include "environment/sandbox.h"
#include "environment/service.h"

ABSL_FLAG(std::string, evaluator, "",
          "Path of the calculator's evaluator binary; empty = calc_eval beside this binary.");
ABSL_FLAG(std::string, default_environment, "calculator",
          "Environment of a task that names none: calculator or arithmetic.");
ABSL_FLAG(int, cpu_seconds, 1, "CPU-time limit of one evaluator run, seconds.");
ABSL_FLAG(int64_t, memory_mb, 256, "Address-space limit of one evaluator run, MiB.");
ABSL_FLAG(int64_t, wall_timeout_ms, 3000, "Wall-clock limit of one evaluator run, milliseconds.");
ABSL_FLAG(bool, require_network_isolation, false,
          "Refuse to evaluate when the evaluator cannot get a network namespace of its own.");
ABSL_FLAG(int, step_threads, 8, "Threads answering Step calls.");
ABSL_FLAG(int64_t, max_episodes, 65536, "Live episodes before Reset says RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, idle_timeout_seconds, 600, "An episode untouched this long is dropped.");

namespace {

std::string BesideSelf(const std::string& name) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return name;
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + name;
}

}  // namespace

int main(int argc, char** argv) {
  rlmesh::InitServerProcess(argc, argv, "environment_server",
                            "environment_server --port=0 --port_file=PATH [--default_environment=calculator]");
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "environment_server: %s\n", s.ToString().c_str());
    return 2;
  };
  auto options = rlmesh::ServerOptionsFromFlags("environment_server");
  if (!options.ok()) return fail(options.status());
  rlmesh::environment::EnvironmentOptions env;
  env.evaluator_path = absl::GetFlag(FLAGS_evaluator).empty() ? BesideSelf("calc_eval") : absl::GetFlag(FLAGS_evaluator);
  env.default_environment = absl::GetFlag(FLAGS_default_environment);
  env.sandbox.cpu_seconds = absl::GetFlag(FLAGS_cpu_seconds);
  env.sandbox.address_space_bytes = absl::GetFlag(FLAGS_memory_mb) << 20;
  env.sandbox.wall_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_wall_timeout_ms));
  env.sandbox.require_network_isolation = absl::GetFlag(FLAGS_require_network_isolation);
  if (absl::Status s = env.Validate(); !s.ok()) return fail(s);
  if (::access(env.evaluator_path.c_str(), X_OK) != 0) {
    return fail(absl::InvalidArgumentError("--evaluator: " + env.evaluator_path + " is not an executable file"));
  }
  rlmesh::environment::EpisodeTableOptions table_options;
  table_options.max_episodes = absl::GetFlag(FLAGS_max_episodes);
  table_options.idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_idle_timeout_seconds));
  if (absl::Status s = table_options.Validate(); !s.ok()) return fail(s);
  if (absl::GetFlag(FLAGS_step_threads) <= 0) return fail(absl::InvalidArgumentError("--step_threads: must be > 0"));
  const bool isolated = rlmesh::environment::NetworkIsolationWorks();
  RLMESH_LOG(INFO) << "evaluator=" << env.evaluator_path << " network_isolation=" << (isolated ? "on" : "off")
                   << (isolated ? "" : " (no user/network namespaces here; the evaluator has the host's network)");
  rlmesh::environment::EpisodeTable table(env, table_options);
  rlmesh::RpcServer server(*options);
  rlmesh::environment::EnvironmentServiceImpl service(&server.auth(), &table, absl::GetFlag(FLAGS_step_threads));
  server.AddService(&service);
  return rlmesh::ServeUntilSignal(server);
}
