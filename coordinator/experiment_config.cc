#include "coordinator/experiment_config.h"

#include "absl/strings/match.h"
#include "common/device_spec.h"

namespace rlmesh {

std::vector<int> PlaceLearnerShardsOnGpus(ExperimentConfig* config) {
  const int shards = config->learner().shards();
  const absl::StatusOr<int> first = ParseDeviceSpec(config->model().device(), "model.device");
  if (shards <= 1 || !first.ok() || *first < 0) return {};
  std::vector<int> gpus;
  for (int k = 0; k < shards; ++k) gpus.push_back(*first + k);
  config->mutable_model()->set_device("cuda");
  return gpus;
}

std::string RolloutDtype(const RolloutConfig& rollout, const std::string& device) {
  if (!rollout.dtype().empty()) return rollout.dtype();
  return absl::StartsWith(device, "cuda") ? "bf16" : "fp32";
}

std::string WeightSyncDtypeName(const std::string& config_dtype) {
  if (config_dtype == "fp32") return "f32";
  if (config_dtype == "bf16") return "bf16";
  if (config_dtype == "fp16") return "f16";
  return "";
}

}  // namespace rlmesh
