#include "coordinator/slurm_launcher.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_join.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

bool Has(const std::string& text, const std::string& line) { return text.find(line) != std::string::npos; }

void Executable(const std::string& path, const std::string& body) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  ::chmod(path.c_str(), 0755);
}

// Role binaries that exist (Validate checks) in a temp bin dir.
SlurmOptions Options(const testing::TempDir& dir) {
  for (Role r : {ROLE_ROLLOUT_WORKER, ROLE_REWARD_SERVER, ROLE_REPLAY_BUFFER, ROLE_LEARNER}) {
    Executable(RoleBinary(dir.File("bin"), r), "exit 0");
  }
  ClusterOptions c;
  c.bin_dir = dir.File("bin");
  c.run_dir = dir.File("run");
  c.rollout_workers = 2;
  c.reward_servers = 1;
  c.learners = 1;
  c.auth_token_file = "/etc/rlmesh/token";
  c.rollout_args = {"--tokenizer=char", "--threads=2"};
  c.learner_args = {"--threads=4"};
  SlurmConfig cfg;
  cfg.set_partition("gpu");
  cfg.set_time_limit("01:30:00");
  cfg.add_learner_nodes(0);
  cfg.add_rollout_worker_nodes(1);
  cfg.add_rollout_worker_nodes(2);
  cfg.set_coordinator_address("10.77.0.1:7401");
  cfg.set_network_interface("eth1");
  cfg.add_sbatch_args("--account=rl");
  return SlurmOptionsFromConfig(c, cfg, "rlmesh-test");
}

TEST_CASE("the batch script allocates the nodes the placement needs and lists one srun step per role") {
  testing::TempDir dir;
  SlurmOptions o = Options(dir);
  REQUIRE(o.Validate().ok());
  const std::string script = BatchScript(o);
  INFO(script);
  CHECK(script.rfind("#!/bin/bash\n", 0) == 0);
  CHECK(Has(script, "\n#SBATCH --job-name=rlmesh-test\n"));
  CHECK(Has(script, "\n#SBATCH --nodes=3\n"));  // node indices 0..2
  CHECK(Has(script, "\n#SBATCH --partition=gpu\n"));
  CHECK(Has(script, "\n#SBATCH --time=01:30:00\n"));
  CHECK(Has(script, "\n#SBATCH --account=rl\n"));
  CHECK(Has(script, "\n#SBATCH --output=" + dir.File("run") + "/logs/slurm-%j.log\n"));
  CHECK(Has(script, "\nexec sleep infinity\n"));
  // One step line per role, each on its node, registering with the coordinator.
  for (const std::string name : {"replay_buffer", "reward-0", "rollout-0", "rollout-1", "learner-0"}) {
    CHECK(Has(script, "--job-name=" + name + " "));
  }
  CHECK(Has(script, "srun '--jobid=$SLURM_JOB_ID' --job-name=rollout-1 --nodes=1 --ntasks=1 --relative=2 --overlap"));
  CHECK(Has(script, "--job-name=learner-0 --nodes=1 --ntasks=1 --relative=0"));
  CHECK(Has(script, "--export=ALL,GLOO_SOCKET_IFNAME=eth1 " + dir.File("bin") + "/learner/learner --port=0 "
                    "--bind=0.0.0.0 --coordinator=10.77.0.1:7401 --instance_name=learner-0 "
                    "--advertise_interface=eth1 --auth_token_file=/etc/rlmesh/token --threads=4 --name=learner-0\n"));
  CHECK(Has(script, "'--replay_buffer=<replay_buffer address>'"));
}

TEST_CASE("nodes: explicit count wins, default is one node") {
  testing::TempDir dir;
  SlurmOptions o = Options(dir);
  o.rollout_worker_nodes.clear();
  o.learner_nodes.clear();
  CHECK(Has(BatchScript(o), "#SBATCH --nodes=1\n"));
  o.nodes = 4;
  CHECK(Has(BatchScript(o), "#SBATCH --nodes=4\n"));
}

TEST_CASE("a restarted step keeps its node and port, and rollout workers get their wiring") {
  testing::TempDir dir;
  SlurmOptions o = Options(dir);
  const auto steps = PlanSteps(o);
  REQUIRE(steps.size() == 5);
  CHECK(steps[0].name == "replay_buffer");
  CHECK(steps[2].name == "rollout-0");
  CHECK(steps[2].node == 1);
  CHECK(steps[3].node == 2);
  const auto argv = StepCommand(o, "42", steps[3], 40123, {"--replay_buffer=10.77.0.11:5000"});
  const std::string line = absl::StrJoin(argv, " ");
  INFO(line);
  CHECK(argv[0] == "srun");
  CHECK(Has(line, "--jobid=42 "));
  CHECK(Has(line, "--relative=2 "));
  CHECK(Has(line, "--port=40123 "));
  CHECK(Has(line, "--name=rollout-1 --replay_buffer=10.77.0.11:5000"));
}

TEST_CASE("options are validated with the field named") {
  testing::TempDir dir;
  SlurmOptions o = Options(dir);
  o.coordinator_address = "127.0.0.1:7401";
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Has(std::string(o.Validate().message()), "slurm.coordinator_address"));
  o.coordinator_address = "10.77.0.1";
  CHECK(Has(std::string(o.Validate().message()), "host:port"));
  o = Options(dir);
  o.nodes = 2;  // rollout-1 wants node index 2
  CHECK(Has(std::string(o.Validate().message()), "node index 2"));
  o = Options(dir);
  o.partition = "gpu; rm -rf /";
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a failing sbatch fails the launch with its message") {
  testing::TempDir dir;
  SlurmOptions o = Options(dir);
  o.sbatch = dir.File("fake/sbatch");
  Executable(o.sbatch, "echo 'sbatch: error: Invalid partition name specified' >&2; exit 1");
  Registry registry;
  auto cluster = SlurmCluster::Launch(o, &registry);
  REQUIRE_FALSE(cluster.ok());
  INFO(cluster.status().ToString());
  CHECK(Has(std::string(cluster.status().message()), "Invalid partition name"));
  // The script it submitted is kept in the run directory.
  CHECK(std::filesystem::exists(dir.File("run") + "/slurm/allocation.sbatch"));
}

TEST_CASE("an allocation that fails is reported, and cancelled") {
  testing::TempDir dir;
  SlurmOptions o = Options(dir);
  o.sbatch = dir.File("fake/sbatch");
  o.squeue = dir.File("fake/squeue");
  o.scancel = dir.File("fake/scancel");
  Executable(o.sbatch, "echo 77");
  Executable(o.squeue, "echo FAILED");
  Executable(o.scancel, "echo \"$@\" > " + dir.File("cancelled"));
  Registry registry;
  auto cluster = SlurmCluster::Launch(o, &registry);
  REQUIRE_FALSE(cluster.ok());
  CHECK(Has(std::string(cluster.status().message()), "slurm job 77 is FAILED"));
  std::ifstream in(dir.File("cancelled"));
  std::string cancelled;
  std::getline(in, cancelled);
  CHECK(cancelled == "77");
}

TEST_CASE("shm weight sync is refused when the learner and a rollout worker are on different hosts") {
  auto role = [](const std::string& name, Role r, const std::string& host) {
    RoleInfo i;
    i.set_name(name);
    i.set_role(r);
    i.set_host(host);
    return i;
  };
  const std::vector<RoleInfo> split = {role("learner-0", ROLE_LEARNER, "node1"),
                                       role("rollout-0", ROLE_ROLLOUT_WORKER, "node1"),
                                       role("rollout-1", ROLE_ROLLOUT_WORKER, "node2")};
  absl::Status s = CheckWeightSyncPlacement(WEIGHT_SYNC_SHM, split);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Has(std::string(s.message()), "learner-0 is on node1 and rollout-1 on node2"));
  CHECK(CheckWeightSyncPlacement(WEIGHT_SYNC_GLOO, split).ok());
  CHECK(CheckWeightSyncPlacement(WEIGHT_SYNC_AUTO, split).ok());
  const std::vector<RoleInfo> together = {role("learner-0", ROLE_LEARNER, "node1"),
                                          role("rollout-0", ROLE_ROLLOUT_WORKER, "node1")};
  CHECK(CheckWeightSyncPlacement(WEIGHT_SYNC_SHM, together).ok());
}

}  // namespace
}  // namespace rlmesh
