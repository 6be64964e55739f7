// A chat template (from a tokenizer_config.json or a .jinja file): parsed
// and rendered on a fixed conversation; errors, never a crash or a hang.
#include <cstdint>
#include <string>

#include "actor/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto t = rlmesh::actor::ChatTemplate::Parse(std::string(reinterpret_cast<const char*>(data), size));
  if (!t.ok()) return 0;
  static const nlohmann::ordered_json kMessages = nlohmann::ordered_json::parse(
      R"([{"role":"system","content":"Be brief."},{"role":"user","content":"2+2?"},)"
      R"({"role":"assistant","content":"4","reasoning_content":"add"},{"role":"user","content":"x"}])");
  rlmesh::actor::ChatTemplateOptions options;
  options.add_generation_prompt = true;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  (void)t->Apply(kMessages, options);
  return 0;
}
