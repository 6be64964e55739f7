#include "coordinator/hang_watch.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/subprocess.h"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// An experiment whose progress the test moves by hand.
struct Progress {
  absl::Mutex mu;
  ExperimentStatus status ABSL_GUARDED_BY(mu);
  std::optional<ExperimentStatus> Get() {
    absl::MutexLock lock(&mu);
    return status;
  }
  void Set(const std::string& state, int64_t step, const std::string& phase) {
    absl::MutexLock lock(&mu);
    status.set_experiment_id("exp");
    status.set_stage("grpo");
    status.set_state(state);
    status.set_step(step);
    status.set_phase(phase);
  }
};

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return done();
}

TEST_CASE("a step stuck in one phase dumps every process's stacks, once per stuck point") {
  testing::TempDir dir;
  auto sleeper = Subprocess::Start({"/bin/sleep", "120"});
  REQUIRE(sleeper.ok());
  Progress progress;
  progress.Set("RUNNING", 3, "train");
  HangWatchOptions o;
  o.after = absl::Milliseconds(300);
  o.poll = absl::Milliseconds(20);
  o.dump_dir = dir.path();
  HangWatch watch(o, [&] { return progress.Get(); }, [&] {
    RoleInfo r;
    r.set_name("learner-0");
    r.set_pid(sleeper->pid());
    return std::vector<RoleInfo>{r};
  });
  REQUIRE(WaitFor([&] { return watch.dumps().size() == 1; }, absl::Seconds(90)));
  const std::string d = watch.dumps()[0];
  CHECK(d.find("exp-0-grpo-3-train") != std::string::npos);
  const std::string learner = Read(d + "/learner-0.txt");
  const std::string coordinator = Read(d + "/coordinator.txt");
  INFO(learner);
  CHECK(learner.find("#0") != std::string::npos);           // a backtrace frame
  CHECK(coordinator.find("HangWatch") != std::string::npos);  // this process, this very thread
  // Still stuck at the same point: no second dump.
  absl::SleepFor(absl::Milliseconds(600));
  CHECK(watch.dumps().size() == 1);
  // Progress, then stuck again: a new dump; a finished experiment: none.
  progress.Set("RUNNING", 4, "generate");
  REQUIRE(WaitFor([&] { return watch.dumps().size() == 2; }, absl::Seconds(90)));
  CHECK(watch.dumps()[1].find("exp-0-grpo-4-generate") != std::string::npos);
  progress.Set("SUCCEEDED", 5, "done");
  absl::SleepFor(absl::Milliseconds(600));
  CHECK(watch.dumps().size() == 2);
  sleeper->Stop(absl::Seconds(1));
}

// Roles that registered from other hosts (Slurm steps, pods): their pids
// belong to those hosts. A local process given such a pid must not be
// attached to; the dump says where the role runs instead.
TEST_CASE("a role on another host is named with its host, not attached to") {
  testing::TempDir dir;
  auto sleeper = Subprocess::Start({"/bin/sleep", "120"});
  REQUIRE(sleeper.ok());
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  Progress progress;
  progress.Set("RUNNING", 7, "train");
  HangWatchOptions o;
  o.after = absl::Milliseconds(200);
  o.poll = absl::Milliseconds(20);
  o.dump_dir = dir.path();
  HangWatch watch(o, [&] { return progress.Get(); }, [&] {
    RoleInfo remote;
    remote.set_name("rollout-1");
    remote.set_host("node2-elsewhere");
    remote.set_pid(sleeper->pid());  // a live local pid: attaching would dump the wrong process
    RoleInfo here;
    here.set_name("learner-0");
    here.set_host(host);
    here.set_pid(sleeper->pid());
    return std::vector<RoleInfo>{remote, here};
  });
  REQUIRE(WaitFor([&] { return watch.dumps().size() == 1; }, absl::Seconds(90)));
  const std::string d = watch.dumps()[0];
  const std::string remote = Read(d + "/rollout-1.txt");
  INFO(remote);
  CHECK(remote.find("rollout-1 runs on host node2-elsewhere (pid " + std::to_string(sleeper->pid()) + ")") !=
        std::string::npos);
  CHECK(remote.find("#0") == std::string::npos);                // no backtrace
  CHECK(Read(d + "/learner-0.txt").find("#0") != std::string::npos);  // this host's role is dumped
  sleeper->Stop(absl::Seconds(1));
}

TEST_CASE("an experiment that keeps moving is never dumped") {
  testing::TempDir dir;
  Progress progress;
  HangWatchOptions o;
  o.after = absl::Milliseconds(200);
  o.poll = absl::Milliseconds(10);
  o.dump_dir = dir.path();
  HangWatch watch(o, [&] { return progress.Get(); }, [] { return std::vector<RoleInfo>{}; });
  for (int step = 0; step < 20; ++step) {
    progress.Set("RUNNING", step, "train");
    absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(watch.dumps().empty());
  CHECK(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace rlmesh
