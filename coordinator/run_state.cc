#include "coordinator/run_state.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  return j;
}

absl::Status WriteJsonFile(const std::string& path, const nlohmann::json& j) {
  return WriteFileAtomically(path, j.dump() + "\n");
}

}  // namespace

absl::StatusOr<RunnerState> RunStateFiles::LoadState() const {
  RLMESH_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(run_dir_ + "/runner_state.json"));
  RunnerState s;
  s.rollout_round = j.value("rollout_round", int64_t{0});
  s.weights_version = j.value("weights_version", int64_t{0});
  return s;
}

absl::Status RunStateFiles::SaveState(const RunnerState& s) const {
  return WriteJsonFile(run_dir_ + "/runner_state.json",
                       {{"rollout_round", s.rollout_round}, {"weights_version", s.weights_version}});
}

std::string RunStateFiles::StageMarkerPath(int i) const { return absl::StrCat(run_dir_, "/stage-", i, ".done.json"); }

absl::StatusOr<StageMarker> RunStateFiles::ReadStageMarker(int i) const {
  const std::string path = StageMarkerPath(i);
  RLMESH_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  if (!j.contains("checkpoint") || !j["checkpoint"].is_string() || !j.contains("accuracy") ||
      !j["accuracy"].is_number()) {
    return absl::DataLossError(absl::StrCat(path, ": needs \"checkpoint\" and \"accuracy\""));
  }
  StageMarker m;
  m.checkpoint = j["checkpoint"].get<std::string>();
  m.accuracy = j["accuracy"].get<double>();
  if (j.contains("init_accuracy") && j["init_accuracy"].is_number()) m.init_accuracy = j["init_accuracy"].get<double>();
  return m;
}

absl::Status RunStateFiles::WriteStageMarker(int i, const StageMarker& m) const {
  nlohmann::json j = {{"checkpoint", m.checkpoint}, {"accuracy", m.accuracy}};
  if (m.init_accuracy) j["init_accuracy"] = *m.init_accuracy;
  return WriteJsonFile(StageMarkerPath(i), j);
}

absl::StatusOr<double> RunStateFiles::ReadInitAccuracy() const {
  const std::string path = run_dir_ + "/init_accuracy.json";
  RLMESH_ASSIGN_OR_RETURN(nlohmann::json j, ReadJsonFile(path));
  if (!j.contains("accuracy") || !j["accuracy"].is_number()) {
    return absl::DataLossError(absl::StrCat(path, ": needs \"accuracy\""));
  }
  return j["accuracy"].get<double>();
}

absl::Status RunStateFiles::WriteInitAccuracy(double accuracy) const {
  return WriteJsonFile(run_dir_ + "/init_accuracy.json", {{"accuracy", accuracy}});
}

}  // namespace rlmesh
