// Preference pairs (the DPO and reward-model datasets): any bytes give
// pairs or an error naming the line and field, never a crash or a hang;
// with the first byte odd the lines may be in the chat format, rendered
// through a ChatML template. Pairs that parse survive a round trip through
// PreferencePairsToJsonl unchanged.
#include <cstdint>
#include <cstdlib>

#include "fuzz/input_file.h"
#include "tasks/chat_prompts.h"
#include "tasks/preferences.h"

namespace {

const rlmesh::ChatRenderer& Renderer() {
  static const rlmesh::ChatRenderer* renderer = [] {
    constexpr char kChatml[] =
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    rlmesh::actor::ChatTemplateOptions o;
    o.eos_token = "<|im_end|>";
    auto r = rlmesh::ChatRenderer::FromSource(kChatml, o);
    if (!r.ok()) std::abort();
    return new rlmesh::ChatRenderer(*std::move(r));
  }();
  return *renderer;
}

bool SamePairs(const std::vector<rlmesh::PreferencePair>& a, const std::vector<rlmesh::PreferencePair>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].prompt != b[i].prompt || a[i].chosen != b[i].chosen || a[i].rejected != b[i].rejected ||
        a[i].prompt_ids != b[i].prompt_ids || a[i].chosen_ids != b[i].chosen_ids ||
        a[i].rejected_ids != b[i].rejected_ids) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const std::string path = rlmesh::fuzz::WriteInputFile(data + 1, size - 1, ".jsonl");
  auto pairs = rlmesh::ReadPreferencePairs(path, chat ? &Renderer() : nullptr);
  if (!pairs.ok()) return 0;
  const std::string text = rlmesh::PreferencePairsToJsonl(*pairs);
  const std::string again_path = rlmesh::fuzz::WriteInputFile(reinterpret_cast<const uint8_t*>(text.data()),
                                                              text.size(), ".jsonl");
  auto again = rlmesh::ReadPreferencePairs(again_path);
  if (!again.ok() || !SamePairs(*pairs, *again)) std::abort();
  return 0;
}
