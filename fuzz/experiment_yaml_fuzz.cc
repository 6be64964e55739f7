// Experiment YAML (what `coordinator run/submit` and Submit.source_yaml
// parse): any bytes give a config or an error, never a crash or a hang.
#include <cstdint>
#include <string>

#include "common/proto_yaml.h"
#include "coordinator/experiment_config.h"
#include "proto/config.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rlmesh::ExperimentConfig config;
  rlmesh::YamlSource source;
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (rlmesh::MergeYaml(text, &config, &source).ok()) {
    rlmesh::NormalizeExperiment(&config, source).IgnoreError();
    rlmesh::ApplyOverride("stages[0].sft.steps=3", &config, &source).IgnoreError();
  }
  return 0;
}
