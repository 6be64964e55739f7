#include "tests/run_util.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"

namespace rlmesh::testing {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string RunDir(const std::string& root) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    if (e.is_directory()) return e.path().string();
  }
  return "";
}

int LastStep(const std::string& run_dir, const std::string& stage) {
  std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
  int last = 0;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == "step" && j.value("stage", "") == stage) {
      last = std::max(last, j.value("step", 0));
    }
  }
  return last;
}

absl::StatusOr<int> RunExperiment(const std::string& config, const std::string& root,
                                  const std::vector<std::string>& args, const std::string& out_file,
                                  absl::Duration limit) {
  std::vector<std::string> argv = {Runfile("coordinator/coordinator"), "run", config, "--run_dir=" + root,
                                   "--bin_dir=" + Runfile("")};
  argv.insert(argv.end(), args.begin(), args.end());
  auto run = Subprocess::Start(argv, out_file);
  if (!run.ok()) return run.status();
  return run->Wait(limit);
}

std::vector<std::string> MetricsWithoutClock(const std::string& run_dir) {
  std::vector<std::string> out;
  std::istringstream metrics(ReadAll(run_dir + "/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) {
      out.push_back("unparsable: " + line);
      continue;
    }
    nlohmann::json kept = nlohmann::json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      if (k == "time" || k.rfind("seconds_", 0) == 0 || k == "tokens_per_second") continue;
      kept[k] = it.value();
    }
    out.push_back(kept.dump());
  }
  return out;
}

std::string CoordinatorAddress(const std::string& run_output) {
  const std::string marker = "cluster up (coordinator ";
  const size_t at = run_output.find(marker);
  if (at == std::string::npos) return "";
  const size_t end = run_output.find(')', at);
  if (end == std::string::npos) return "";
  return run_output.substr(at + marker.size(), end - at - marker.size());
}

std::string StageCheckpoint(const std::string& run_dir, int stage_index) {
  auto j = nlohmann::json::parse(ReadAll(run_dir + "/stage-" + std::to_string(stage_index) + ".done.json"), nullptr,
                                 false);
  if (j.is_discarded() || !j.contains("checkpoint")) return "";
  return j["checkpoint"].get<std::string>();
}

}  // namespace rlmesh::testing
