#include "actor/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "actor/lora.h"
#include "actor/safetensors.h"
#include "actor/transformer.h"
#include "common/atomic_file.h"
#include "common/json_file.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace rlmesh::actor {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kSingle[] = "model.safetensors";
constexpr char kIndex[] = "model.safetensors.index.json";

// Opens every file of a folder and maps tensor name -> file.
struct WeightFiles {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> by_name;
};

absl::StatusOr<WeightFiles> OpenWeights(const std::string& dir) {
  WeightFiles w;
  std::vector<std::string> names;
  const std::string single = dir + "/" + kSingle;
  const std::string index = dir + "/" + kIndex;
  std::map<std::string, std::string> expected;  // tensor -> shard file (index)
  if (fs::exists(single)) {
    names.push_back(kSingle);
  } else if (fs::exists(index)) {
    std::ifstream in(index);
    std::stringstream ss;
    ss << in.rdbuf();
    json j;
    try {
      j = json::parse(ss.str());
    } catch (const json::parse_error& e) {
      return absl::DataLossError(absl::StrCat(index, ": corrupt JSON at byte ", e.byte, ": ", e.what()));
    } catch (const json::exception& e) {  // a number out of range, say
      return absl::DataLossError(absl::StrCat(index, ": corrupt JSON: ", e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return absl::DataLossError(absl::StrCat(index, ": no \"weight_map\" object"));
    }
    std::set<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) return absl::DataLossError(absl::StrCat(index, ": weight_map[\"", it.key(), "\"] is not a string"));
      std::string f = it->get<std::string>();
      if (f.find('/') != std::string::npos || f == "..") {
        return absl::DataLossError(absl::StrCat(index, ": weight_map[\"", it.key(), "\"] names a file outside the folder"));
      }
      expected[it.key()] = f;
      files.insert(f);
    }
    names.assign(files.begin(), files.end());
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": neither ", kSingle, " nor ", kIndex));
  }
  for (const auto& n : names) {
    RLMESH_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(dir + "/" + n));
    for (const auto& e : f->entries()) {
      if (w.by_name.count(e.name)) {
        return absl::DataLossError(absl::StrCat(dir, ": tensor \"", e.name, "\" is in both ", w.by_name[e.name]->path(),
                                                " and ", f->path()));
      }
      auto ex = expected.find(e.name);
      if (!expected.empty() && (ex == expected.end() || ex->second != n)) {
        return absl::DataLossError(absl::StrCat(index, ": tensor \"", e.name, "\" is in ", n,
                                                " but the index does not place it there"));
      }
      w.by_name[e.name] = f.get();
    }
    w.files.push_back(std::move(f));
  }
  for (const auto& [name, file] : expected) {
    if (!w.by_name.count(name)) {
      return absl::DataLossError(absl::StrCat(index, ": tensor \"", name, "\" listed for ", file, " is not in it"));
    }
  }
  return w;
}

std::string ShapeStr(at::IntArrayRef s) { return c10::str(s); }

}  // namespace

absl::Status LoadOptions::Validate() const {
  auto d = ParseDtype(dtype);
  if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("LoadOptions.", d.status().message()));
  try {
    c10::Device dev(device);
    (void)dev;
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError(absl::StrCat("LoadOptions.device: \"", device, "\" is not a device"));
  }
  return absl::OkStatus();
}

absl::Status SaveOptions::Validate() const {
  auto d = ParseDtype(dtype);
  if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("SaveOptions.", d.status().message()));
  if (max_shard_bytes < 0) return absl::InvalidArgumentError("SaveOptions.max_shard_bytes: must be >= 0");
  return absl::OkStatus();
}

absl::Status LoadHfWeights(const std::string& dir, Transformer& model, const LoadOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  RLMESH_ASSIGN_OR_RETURN(WeightFiles w, OpenWeights(dir));
  auto params = model->NamedParameters();
  std::set<std::string> used;
  try {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : params) {
      auto it = w.by_name.find(name);
      if (it == w.by_name.end()) {
        if (name == "score.weight" && options.allow_missing_value_head) continue;
        return absl::NotFoundError(absl::StrCat(dir, ": missing tensor \"", name, "\" (model expects shape ",
                                                ShapeStr(p.sizes()), ")"));
      }
      const SafetensorsEntry* e = it->second->Find(name);
      if (at::IntArrayRef(e->shape) != p.sizes()) {
        return absl::InvalidArgumentError(absl::StrCat(it->second->path(), ": tensor \"", name, "\" has shape ",
                                                       ShapeStr(e->shape), ", model expects ", ShapeStr(p.sizes())));
      }
      RLMESH_ASSIGN_OR_RETURN(at::Tensor t, it->second->Read(name));
      if (!t.is_floating_point()) {
        return absl::InvalidArgumentError(absl::StrCat(it->second->path(), ": tensor \"", name, "\" has dtype ",
                                                       e->dtype, ", expected a float type"));
      }
      p.copy_(t);
      used.insert(name);
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LoadHfWeights ", dir, ": ", e.what_without_backtrace()));
  }
  int skipped = 0;
  for (const auto& [name, f] : w.by_name) {
    if (used.count(name)) continue;
    // Tied checkpoints may still carry a copy of the embedding as lm_head.
    if (name == "lm_head.weight" && model->config().tie_embeddings) continue;
    if (options.strict) {
      return absl::InvalidArgumentError(absl::StrCat(f->path(), ": unexpected tensor \"", name, "\""));
    }
    ++skipped;
  }
  if (skipped > 0) RLMESH_LOG(WARNING) << "checkpoint dir=" << dir << " skipped_tensors=" << skipped;
  if (HasAdapterFiles(dir)) {
    RLMESH_RETURN_IF_ERROR(LoadAdapter(dir, model));
    if (options.merge_adapter) MergeLora(model);
  }
  return absl::OkStatus();
}

absl::StatusOr<Transformer> LoadHfModel(const std::string& dir, const LoadOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  RLMESH_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromHfConfigJson(dir + "/config.json"));
  if (options.add_value_head) config.value_head = true;
  try {
    Transformer model(config);
    RLMESH_RETURN_IF_ERROR(LoadHfWeights(dir, model, options));
    model->to(c10::Device(options.device), *ParseDtype(options.dtype));
    return model;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LoadHfModel ", dir, ": ", e.what_without_backtrace()));
  }
}

namespace {

const char* HfDtypeName(c10::ScalarType dtype) {
  return dtype == at::kFloat ? "float32" : dtype == at::kBFloat16 ? "bfloat16" : "float16";
}

// generation_config.json: generate() reads its special ids (and sampling
// defaults) from here, not from config.json. The tokenizer's folder's own
// file is kept as it is (sampling defaults and all) but for eos_token_id,
// which becomes every stop id the run used.
std::string GenerationConfigJson(const ModelConfig& cfg, const Tokenizer* tokenizer) {
  json gen;
  if (tokenizer != nullptr && !tokenizer->source_dir().empty()) {
    // Absent (or, had the folder changed since the tokenizer read it, no
    // longer an object): written from the model config below.
    absl::StatusOr<json> source = ReadJsonObjectFile(tokenizer->source_dir() + "/generation_config.json");
    if (source.ok()) gen = *std::move(source);
  }
  if (gen.is_null()) {
    gen = {{"_from_model_config", true}};
    for (auto [key, id] : {std::pair<const char*, int64_t>{"bos_token_id", cfg.bos_token_id},
                           {"pad_token_id", cfg.pad_token_id}}) {
      if (id >= 0) gen[key] = id;
    }
  }
  std::vector<int64_t> stop;
  if (tokenizer != nullptr) {
    for (int id : tokenizer->stop_ids()) stop.push_back(id);
  }
  if (stop.empty() && cfg.eos_token_id >= 0) stop.push_back(cfg.eos_token_id);
  if (stop.size() == 1) {
    gen["eos_token_id"] = stop[0];
  } else if (!stop.empty()) {
    gen["eos_token_id"] = stop;
  }
  return gen.dump(2) + "\n";
}

// Everything of a saved folder but the weights: config.json,
// generation_config.json and the tokenizer's files, into `dir` (created).
absl::Status WriteHfModelFiles(const ModelConfig& cfg, c10::ScalarType dtype, const std::string& dir,
                               const SaveOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", dir, ": ", ec.message()));
  RLMESH_RETURN_IF_ERROR(WriteFileAtomically(dir + "/config.json", cfg.ToHfConfigJson(HfDtypeName(dtype))));
  RLMESH_RETURN_IF_ERROR(
      WriteFileAtomically(dir + "/generation_config.json", GenerationConfigJson(cfg, options.tokenizer)));
  if (options.tokenizer != nullptr) {
    for (const auto& [file, text] : HfTokenizerFiles(*options.tokenizer, cfg.max_positions)) {
      RLMESH_RETURN_IF_ERROR(WriteFileAtomically(dir + "/" + file, text));
    }
  }
  return absl::OkStatus();
}

const std::map<std::string, std::string>& SafetensorsMetadata() {
  static const auto* meta = new std::map<std::string, std::string>{{"format", "pt"}};
  return *meta;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> OpenHfModelWriter(
    const ModelConfig& config, const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
    const std::string& dir, const SaveOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  if (options.max_shard_bytes != 0) {
    return absl::InvalidArgumentError("max_shard_bytes: a model written as it streams is one file (0)");
  }
  const c10::ScalarType dtype = *ParseDtype(options.dtype);
  RLMESH_RETURN_IF_ERROR(WriteHfModelFiles(config, dtype, dir, options));
  std::error_code ec;
  fs::remove(dir + "/" + kIndex, ec);
  std::vector<SafetensorsSpec> specs;
  for (const auto& [name, shape] : shapes) specs.push_back({name, dtype, shape});
  return SafetensorsWriter::Open(dir + "/" + kSingle, std::move(specs), SafetensorsMetadata());
}

namespace {

// The adapter files of `model` (its adapters' spec read off the layers), or
// none: an adapter left from an earlier save would be loaded with weights
// it was not trained with.
absl::Status SaveAdapterOrRemoveStale(Transformer& model, const std::string& dir) {
  const LoraSpec spec = AdapterSpecOf(model);
  if (!spec.targets.empty()) return SaveAdapter(model, spec, dir);
  std::error_code ec;
  fs::remove(dir + "/adapter_config.json", ec);
  fs::remove(dir + "/adapter_model.safetensors", ec);
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveHfModel(Transformer& model, const std::string& dir, const SaveOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  const auto named = model->NamedParameters();
  if (options.max_shard_bytes == 0) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const auto& [name, p] : named) shapes.emplace_back(name, p.sizes().vec());
    RLMESH_ASSIGN_OR_RETURN(auto writer, OpenHfModelWriter(model->config(), shapes, dir, options));
    for (const auto& [name, p] : named) RLMESH_RETURN_IF_ERROR(writer->AppendTensor(name, p));
    RLMESH_RETURN_IF_ERROR(writer->Commit());
    return SaveAdapterOrRemoveStale(model, dir);
  }
  const c10::ScalarType dtype = *ParseDtype(options.dtype);
  RLMESH_RETURN_IF_ERROR(WriteHfModelFiles(model->config(), dtype, dir, options));
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  int64_t shard_bytes = 0, total = 0;
  try {
    for (const auto& [name, p] : named) {
      at::Tensor t = p.detach().to(at::kCPU, dtype).contiguous();
      int64_t bytes = t.numel() * t.element_size();
      if (shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes) {
        shards.emplace_back();
        shard_bytes = 0;
      }
      shards.back().emplace_back(name, t);
      shard_bytes += bytes;
      total += bytes;
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("SaveHfModel ", dir, ": ", e.what_without_backtrace()));
  }
  json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = json::object();
  const int n = static_cast<int>(shards.size());
  for (int i = 0; i < n; ++i) {
    std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
    RLMESH_RETURN_IF_ERROR(WriteSafetensors(dir + "/" + file, shards[i], SafetensorsMetadata()));
    for (const auto& [name, t] : shards[i]) index["weight_map"][name] = file;
  }
  RLMESH_RETURN_IF_ERROR(WriteFileAtomically(dir + "/" + kIndex, index.dump(2) + "\n"));
  std::error_code ec;
  fs::remove(dir + "/" + kSingle, ec);
  return SaveAdapterOrRemoveStale(model, dir);
}

}  // namespace rlmesh::actor
