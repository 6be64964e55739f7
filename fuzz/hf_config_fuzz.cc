// A checkpoint's config.json: a model config or an error naming the field.
#include <cstdint>
#include <string>

#include "actor/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = rlmesh::actor::ModelConfig::FromHfConfigJsonString(
      std::string(reinterpret_cast<const char*>(data), size));
  if (config.ok()) {
    config->Validate().IgnoreError();
    (void)config->ToHfConfigJson();
  }
  return 0;
}
