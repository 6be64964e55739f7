#include "actor/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "actor/safetensors.h"
#include "actor/transformer.h"
#include "common/atomic_file.h"
#include "common/json_file.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace rlmesh::actor {
namespace {

using json = nlohmann::json;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

constexpr char kPeftPrefix[] = "base_model.model.";

// "model.layers.3.self_attn.q_proj" -> "q_proj".
std::string LeafName(const std::string& module) {
  const size_t dot = module.rfind('.');
  return dot == std::string::npos ? module : module.substr(dot + 1);
}

bool Targeted(const LoraSpec& spec, const std::string& module) {
  return std::find(spec.targets.begin(), spec.targets.end(), LeafName(module)) != spec.targets.end();
}

absl::Status CheckSpec(const LoraSpec& spec) {
  if (spec.rank <= 0) return absl::InvalidArgumentError(absl::StrCat("lora rank: ", spec.rank, " must be > 0"));
  if (!(spec.alpha > 0) || !std::isfinite(spec.alpha)) {
    return absl::InvalidArgumentError(absl::StrCat("lora alpha: ", spec.alpha, " must be > 0"));
  }
  if (!(spec.dropout >= 0 && spec.dropout < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("lora dropout: ", spec.dropout, " must be in [0, 1)"));
  }
  if (spec.targets.empty()) return absl::InvalidArgumentError("lora targets: empty");
  for (const std::string& t : spec.targets) {
    const auto& all = LoraTargetNames();
    if (std::find(all.begin(), all.end(), t) == all.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora targets: \"", t, "\" is not one of ", absl::StrJoin(all, ", ")));
    }
  }
  if (spec.init != "default" && spec.init != "gaussian") {
    return absl::InvalidArgumentError(absl::StrCat("lora init: \"", spec.init, "\" must be default or gaussian"));
  }
  return absl::OkStatus();
}

}  // namespace

double LoraSpec::Scaling() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

const std::vector<std::string>& LoraTargetNames() {
  static const auto* names =
      new std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return *names;
}

AdaptersOff::AdaptersOff(Transformer& model) : model_(model) { model_->SetAdaptersEnabled(false); }

AdaptersOff::~AdaptersOff() { model_->SetAdaptersEnabled(true); }

bool IsAdapterTensorName(const std::string& name) { return AdapterModule(name).ok(); }

absl::StatusOr<std::string> AdapterModule(const std::string& name) {
  for (absl::string_view suffix : {".lora_A.weight", ".lora_B.weight"}) {
    if (absl::EndsWith(name, suffix)) return name.substr(0, name.size() - suffix.size());
  }
  return absl::InvalidArgumentError(absl::StrCat("adapter tensor ", name, ": not a lora_A/lora_B weight"));
}

LoraSpec AdapterSpecOf(Transformer& model) {
  LoraSpec spec;
  spec.targets.clear();
  for (const auto& [name, linear] : model->AdaptableLinears()) {
    if (!linear->has_adapter()) continue;
    spec.rank = linear->lora_A().size(0);
    spec.alpha = linear->lora_scaling() * static_cast<double>(spec.rank);
    const std::string leaf = LeafName(name);
    if (std::find(spec.targets.begin(), spec.targets.end(), leaf) == spec.targets.end()) spec.targets.push_back(leaf);
  }
  return spec;
}

absl::Status AttachLora(Transformer& model, const LoraSpec& spec) {
  RLMESH_RETURN_IF_ERROR(CheckSpec(spec));
  if (model->config().NumMoeLayers() > 0) {
    return absl::FailedPreconditionError(absl::StrCat("LoRA on a policy with MoE layers (", model->config().NumMoeLayers(),
                                                      ") is not built: routed experts cannot carry adapters"));
  }
  at::NoGradGuard no_grad;
  for (auto& [name, linear] : model->AdaptableLinears()) {
    if (!Targeted(spec, name)) {
      linear->DropAdapter();
      continue;
    }
    const at::Tensor& w = linear->weight;
    at::Tensor a = at::empty({spec.rank, w.size(1)}, w.options());
    if (spec.init == "gaussian") {
      a.normal_(0.0, 1.0 / static_cast<double>(spec.rank));
    } else {
      torch::nn::init::kaiming_uniform_(a, std::sqrt(5.0));
    }
    at::Tensor b = at::zeros({w.size(0), spec.rank}, w.options());
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    linear->SetAdapter(a, b, spec.Scaling(), spec.dropout);
  }
  return absl::OkStatus();
}

void MergeLora(Transformer& model) {
  at::NoGradGuard no_grad;
  for (auto& [name, linear] : model->AdaptableLinears()) {
    if (!linear->has_adapter()) continue;
    at::Tensor delta = at::matmul(linear->lora_B().to(at::kFloat), linear->lora_A().to(at::kFloat));
    linear->weight.add_((delta * linear->lora_scaling()).to(linear->weight.scalar_type()));
    linear->DropAdapter();
  }
}

void DropLora(Transformer& model) {
  for (auto& [name, linear] : model->AdaptableLinears()) linear->DropAdapter();
}

absl::Status SetAdapters(Transformer& model, const Named& tensors, double scaling, double dropout) {
  std::map<std::string, LoraLinear> linears;
  for (auto& [name, linear] : model->AdaptableLinears()) linears.emplace(name, linear);
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> got;
  for (const auto& [name, t] : tensors) {
    RLMESH_ASSIGN_OR_RETURN(const std::string module, AdapterModule(name));
    const bool is_a = absl::EndsWith(name, ".lora_A.weight");
    auto it = linears.find(module);
    if (it == linears.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter tensor ", name, ": ", module, " is not an adaptable linear layer of the model"));
    }
    auto& slot = is_a ? got[module].first : got[module].second;
    if (slot.defined()) return absl::InvalidArgumentError(absl::StrCat("adapter tensor ", name, ": given twice"));
    if (t.dim() != 2) return absl::InvalidArgumentError(absl::StrCat("adapter tensor ", name, ": not 2-d"));
    slot = t;
  }
  for (const auto& [module, ab] : got) {
    const auto& [a, b] = ab;
    if (!a.defined() || !b.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter of ", module, ": lora_", a.defined() ? "B" : "A", ".weight missing"));
    }
    const at::Tensor& w = linears.at(module)->weight;
    if (a.size(1) != w.size(1) || b.size(0) != w.size(0) || a.size(0) != b.size(1)) {
      return absl::InvalidArgumentError(absl::StrCat("adapter of ", module, ": lora_A ", c10::str(a.sizes()),
                                                     " and lora_B ", c10::str(b.sizes()), " do not fit its weight ",
                                                     c10::str(w.sizes()), " (A [r, in], B [out, r])"));
    }
  }
  at::NoGradGuard no_grad;
  for (auto& [module, linear] : linears) {
    auto it = got.find(module);
    if (it == got.end()) {
      linear->DropAdapter();
      continue;
    }
    const at::Tensor& w = linear->weight;
    const at::Tensor& a = it->second.first;
    const at::Tensor& b = it->second.second;
    if (linear->has_adapter() && linear->lora_A().sizes() == a.sizes() && linear->lora_B().sizes() == b.sizes() &&
        linear->lora_scaling() == scaling) {
      // Same shapes: in place, so that memory (and a captured CUDA graph)
      // keeps pointing at the same storage.
      linear->lora_A().copy_(a);
      linear->lora_B().copy_(b);
      continue;
    }
    linear->SetAdapter(a.to(w.options()).clone(), b.to(w.options()).clone(), scaling, dropout);
  }
  return absl::OkStatus();
}

bool HasAdapterFiles(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(dir + "/adapter_config.json", ec);
}

absl::StatusOr<LoadedAdapter> ReadAdapter(const std::string& dir) {
  const std::string config_path = dir + "/adapter_config.json";
  RLMESH_ASSIGN_OR_RETURN(json j, ReadJsonObjectFile(config_path));
  auto refuse = [&](const std::string& key, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", key, ": ", why));
  };
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  LoadedAdapter out;
  try {
    if (j.value("peft_type", std::string("LORA")) != "LORA") return refuse("peft_type", "only LORA is supported");
    if (j.value("use_dora", false)) return refuse("use_dora", "DoRA adapters are not supported");
    if (j.value("bias", std::string("none")) != "none") return refuse("bias", "only \"none\" is supported");
    if (j.value("fan_in_fan_out", false)) return refuse("fan_in_fan_out", "only false (Linear layers) is supported");
    if (present("modules_to_save") && !j["modules_to_save"].empty()) {
      return refuse("modules_to_save", "fully trained extra modules are not supported");
    }
    if (present("layers_to_transform")) return refuse("layers_to_transform", "not supported (every layer)");
    for (const char* key : {"rank_pattern", "alpha_pattern"}) {
      if (present(key) && !j[key].empty()) return refuse(key, "per-layer ranks or alphas are not supported");
    }
    if (!present("r")) return refuse("r", "missing");
    out.spec.rank = j["r"].get<int64_t>();
    out.spec.alpha = present("lora_alpha") ? j["lora_alpha"].get<double>() : 8.0;
    out.spec.rslora = j.value("use_rslora", false);
    out.spec.dropout = present("lora_dropout") ? j["lora_dropout"].get<double>() : 0.0;
    const json& targets = j.value("target_modules", json());
    if (targets.is_string()) {
      if (targets.get<std::string>() != "all-linear") {
        return refuse("target_modules", absl::StrCat("the pattern \"", targets.get<std::string>(),
                                                      "\" is not supported (a list of names, or all-linear)"));
      }
      out.spec.targets = LoraTargetNames();
    } else if (targets.is_array()) {
      for (const json& t : targets) out.spec.targets.push_back(t.get<std::string>());
    } else {
      return refuse("target_modules", "missing");
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", e.what()));
  }
  if (absl::Status s = CheckSpec(out.spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", s.message()));
  }
  const std::string weights_path = dir + "/adapter_model.safetensors";
  RLMESH_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(weights_path));
  for (const SafetensorsEntry& e : file->entries()) {
    std::string name = e.name;
    if (absl::StartsWith(name, kPeftPrefix)) name = name.substr(sizeof(kPeftPrefix) - 1);
    if (!IsAdapterTensorName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": tensor ", e.name, " is not a lora_A/lora_B weight"));
    }
    RLMESH_ASSIGN_OR_RETURN(at::Tensor t, file->Read(e.name));
    out.tensors.emplace_back(name, t.to(at::kFloat));
  }
  if (out.tensors.empty()) return absl::InvalidArgumentError(absl::StrCat(weights_path, ": no tensors"));
  for (const auto& [name, t] : out.tensors) {
    if (name.find(".lora_A.") != std::string::npos && t.dim() == 2 && t.size(0) != out.spec.rank) {
      return absl::InvalidArgumentError(absl::StrCat(weights_path, ": ", name, " has rank ", t.size(0), ", config r ",
                                                     out.spec.rank));
    }
  }
  return out;
}

absl::Status LoadAdapter(const std::string& dir, Transformer& model) {
  RLMESH_ASSIGN_OR_RETURN(LoadedAdapter adapter, ReadAdapter(dir));
  absl::Status s = SetAdapters(model, adapter.tensors, adapter.spec.Scaling());
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(dir, "/adapter_model.safetensors: ", s.message()));
  return absl::OkStatus();
}

absl::Status SaveAdapter(Transformer& model, const LoraSpec& spec, const std::string& dir, const std::string& base) {
  const Named params = model->AdapterParameters();
  if (params.empty()) return absl::FailedPreconditionError("SaveAdapter: the model has no adapters");
  Named tensors;
  for (const auto& [name, t] : params) tensors.emplace_back(kPeftPrefix + name, t.detach().to(at::kFloat).cpu());
  RLMESH_RETURN_IF_ERROR(WriteSafetensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}}));
  json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base.empty() ? json() : json(base)},
      {"r", spec.rank},
      {"lora_alpha", spec.alpha},
      {"use_rslora", spec.rslora},
      {"lora_dropout", spec.dropout},
      {"target_modules", spec.targets},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_dora", false},
      {"modules_to_save", json()},
      {"layers_to_transform", json()},
      {"init_lora_weights", spec.init == "gaussian" ? json("gaussian") : json(true)},
      {"inference_mode", true},
  };
  return WriteFileAtomically(dir + "/adapter_config.json", j.dump(2) + "\n");
}

}  // namespace rlmesh::actor
