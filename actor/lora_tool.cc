// LoRA adapters of a model folder (actor/lora.h), from the command line:
//
//   lora_tool merge IN OUT
//       IN: a model folder with an adapter (a LoRA checkpoint of a run, or a
//       base folder with PEFT's adapter files beside it). Writes OUT, a
//       plain Hugging Face folder of the merged model (W + scaling * B A)
//       with IN's tokenizer and generation files.
//   lora_tool logits DIR IDS OUT [ADAPTER]
//       The logits [1, T, V] (fp32) of DIR's model (with its adapter, or
//       with the PEFT adapter folder ADAPTER instead) on the comma-separated
//       token ids IDS, written to OUT as a safetensors file ("logits").
//   lora_tool random-adapter IN OUT RANK ALPHA TARGETS SEED
//       IN's model with a random adapter (A and B both random, so that it
//       changes the outputs; TARGETS comma-separated, e.g. q_proj,v_proj),
//       saved into OUT (base weights + PEFT adapter files). For tests.
//
// Exits 0 on success, 1 with the error on stderr, 2 on bad usage.

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "actor/checkpoint.h"
#include "actor/lora.h"
#include "actor/safetensors.h"
#include "actor/transformer.h"
#include "common/status_macros.h"

namespace rlmesh::actor {
namespace {

namespace fs = std::filesystem;

bool IsWeightFile(const std::string& name) {
  return name == "config.json" || name == "model.safetensors.index.json" || name == "adapter_config.json" ||
         name == "adapter_model.safetensors" || (name.rfind("model", 0) == 0 && name.size() > 12 &&
                                                  name.compare(name.size() - 12, 12, ".safetensors") == 0);
}

// Creates `out` and copies into it every file of `in` but the weights and
// the adapter: the tokenizer, chat template and generation settings travel
// as they are.
absl::Status CopyOtherFiles(const std::string& in, const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", out, ": ", ec.message()));
  for (const auto& entry : fs::directory_iterator(in, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || IsWeightFile(name)) continue;
    fs::copy_file(entry.path(), fs::path(out) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("copy ", entry.path().string(), ": ", ec.message()));
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", in, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status Merge(const std::string& in, const std::string& out) {
  if (!HasAdapterFiles(in)) {
    return absl::InvalidArgumentError(absl::StrCat(in, ": no adapter_config.json (nothing to merge)"));
  }
  LoadOptions lo;
  lo.merge_adapter = true;
  RLMESH_ASSIGN_OR_RETURN(Transformer model, LoadHfModel(in, lo));
  RLMESH_RETURN_IF_ERROR(CopyOtherFiles(in, out));
  std::error_code ec;
  const fs::path generation = fs::path(in) / "generation_config.json";
  RLMESH_RETURN_IF_ERROR(SaveHfModel(model, out));
  if (fs::exists(generation)) {
    fs::copy_file(generation, fs::path(out) / "generation_config.json", fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("copy ", generation.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status Logits(const std::string& dir, const std::string& ids_text, const std::string& out,
                    const std::string& adapter) {
  std::vector<int64_t> ids;
  for (absl::string_view part : absl::StrSplit(ids_text, ',')) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) return absl::InvalidArgumentError(absl::StrCat("IDS: \"", part, "\""));
    ids.push_back(id);
  }
  RLMESH_ASSIGN_OR_RETURN(Transformer model, LoadHfModel(dir));
  if (!adapter.empty()) RLMESH_RETURN_IF_ERROR(LoadAdapter(adapter, model));
  model->eval();
  at::NoGradGuard no_grad;
  const int64_t T = static_cast<int64_t>(ids.size());
  at::Tensor input = at::tensor(ids, at::kLong).view({1, T});
  at::Tensor pos = at::arange(T, at::kLong).view({1, T});
  at::Tensor logits = model->Forward(input, pos).to(at::kFloat).contiguous();
  return WriteSafetensors(out, {{"logits", logits}});
}

absl::Status RandomAdapter(const std::string& in, const std::string& out, const std::string& rank,
                           const std::string& alpha, const std::string& targets, const std::string& seed) {
  LoraSpec spec;
  uint64_t s = 0;
  if (!absl::SimpleAtoi(rank, &spec.rank) || !absl::SimpleAtod(alpha, &spec.alpha) || !absl::SimpleAtoi(seed, &s)) {
    return absl::InvalidArgumentError("RANK, ALPHA and SEED must be numbers");
  }
  spec.targets = absl::StrSplit(targets, ',');
  RLMESH_ASSIGN_OR_RETURN(Transformer model, LoadHfModel(in));
  at::manual_seed(s);
  RLMESH_RETURN_IF_ERROR(AttachLora(model, spec));
  {
    at::NoGradGuard no_grad;
    for (auto& [name, t] : model->AdapterParameters()) t.normal_(0.0, 0.05);
  }
  RLMESH_RETURN_IF_ERROR(CopyOtherFiles(in, out));
  return SaveHfModel(model, out);
}

int Main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::Status s;
  if (args.size() == 3 && args[0] == "merge") {
    s = Merge(args[1], args[2]);
  } else if ((args.size() == 4 || args.size() == 5) && args[0] == "logits") {
    s = Logits(args[1], args[2], args[3], args.size() == 5 ? args[4] : "");
  } else if (args.size() == 7 && args[0] == "random-adapter") {
    s = RandomAdapter(args[1], args[2], args[3], args[4], args[5], args[6]);
  } else {
    std::fprintf(stderr,
                 "usage: lora_tool merge IN OUT\n"
                 "       lora_tool logits DIR IDS OUT [ADAPTER]\n"
                 "       lora_tool random-adapter IN OUT RANK ALPHA TARGETS SEED\n");
    return 2;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "lora_tool: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace rlmesh::actor

int main(int argc, char** argv) { return rlmesh::actor::Main(argc, argv); }
