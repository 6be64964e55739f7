#include "coordinator/metrics_sink.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace rlmesh {

absl::Status MetricsSink::Open(const std::string& run_dir, bool jsonl, bool tensorboard) {
  if (jsonl) {
    jsonl_.open(run_dir + "/metrics.jsonl", std::ios::app);
    if (!jsonl_) return absl::PermissionDeniedError(absl::StrCat("cannot write ", run_dir, "/metrics.jsonl"));
  }
  if (tensorboard) {
    RLMESH_ASSIGN_OR_RETURN(tensorboard_, TensorBoardWriter::Create(run_dir + "/tensorboard"));
  }
  return absl::OkStatus();
}

void MetricsSink::Record(const nlohmann::json& j) {
  if (jsonl_.is_open()) {
    jsonl_ << j.dump() << "\n";
    jsonl_.flush();
  }
  if (!tensorboard_) return;
  const std::string stage = j.value("stage", std::string("run"));
  const double wall = j.value("time", 0.0);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number() || it.key() == "time" || it.key() == "step") continue;
    // A scalar that cannot be written is not worth failing a run for.
    tensorboard_->AddScalar(absl::StrCat(stage, "/", it.key()), step_, it.value().get<double>(), wall).IgnoreError();
  }
}

}  // namespace rlmesh
