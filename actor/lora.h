#pragma once

// LoRA adapters on a Transformer (actor/transformer.h LoraLinear), and their
// folder format: PEFT's adapter_config.json + adapter_model.safetensors, so
// that an adapter rlmesh trains opens with peft.PeftModel.from_pretrained on
// the base model, and an adapter PEFT wrote loads here.
//
// The adapter of linear layer W (out x in) is A [rank, in] and B [out, rank]:
// the layer computes x W^T + scaling * (x A^T) B^T, scaling = alpha / rank
// (alpha / sqrt(rank) for rsLoRA adapters PEFT wrote).
//
// Functions on a model are not thread-safe (see actor/transformer.h); the
// file functions are safe for concurrent use on distinct folders.

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/transformer_fwd.h"

namespace rlmesh::actor {

struct LoraSpec {
  // Adapter rank (> 0).
  int64_t rank = 8;
  // scaling = alpha / rank (rslora: alpha / sqrt(rank)).
  double alpha = 8;
  bool rslora = false;
  // Dropout on the adapter's input in training passes.
  double dropout = 0;
  // Module names of the linear layers that get adapters: a subset of
  // LoraTargetNames().
  std::vector<std::string> targets;
  // "default" (PEFT's: A Kaiming-uniform with a = sqrt(5), B zero) or
  // "gaussian" (A normal with std 1 / rank, B zero).
  std::string init = "default";

  double Scaling() const;
};

// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
const std::vector<std::string>& LoraTargetNames();

// Gives every adaptable linear layer of `model` named in spec.targets a
// fresh adapter (initialised per spec.init from LibTorch's global generator,
// on the layer's device and dtype, requires_grad on), replacing any it had.
// INVALID_ARGUMENT for a bad spec; FAILED_PRECONDITION for a model with MoE
// layers (their experts cannot carry adapters).
absl::Status AttachLora(Transformer& model, const LoraSpec& spec);

// Adds every adapter into its base weight (W += scaling * B A) and drops the
// adapters: the model then computes what it computed with them, without.
void MergeLora(Transformer& model);

// Drops every adapter.
void DropLora(Transformer& model);

// Turns the adapters off for its lifetime (the base model), then on again.
class AdaptersOff {
 public:
  explicit AdaptersOff(Transformer& model);
  ~AdaptersOff();
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  Transformer& model_;
};

// True for an adapter tensor's name ("....lora_A.weight", "....lora_B.weight").
bool IsAdapterTensorName(const std::string& name);

// The module an adapter tensor belongs to: "model.layers.0.self_attn.q_proj"
// for "model.layers.0.self_attn.q_proj.lora_A.weight" (or lora_B).
// INVALID_ARGUMENT naming `name` when it is not an adapter tensor's name.
absl::StatusOr<std::string> AdapterModule(const std::string& name);

// The spec of the adapters `model` carries, read off its layers: rank and
// alpha (alpha = scaling * rank, as if not rsLoRA) of the last adapted layer,
// and the leaf names of the adapted layers ("q_proj") in the order met;
// the other fields keep their defaults. No targets when it carries none.
LoraSpec AdapterSpecOf(Transformer& model);

// Sets `model`'s adapters to `tensors` (AdapterParameters() names: each
// adapted layer's lora_A then lora_B, in any order), copied to each layer's
// device and dtype (requires_grad off), with `scaling` and `dropout`;
// layers not named lose their adapter.
// The tensors are checked before anything changes: INVALID_ARGUMENT names
// one that is not an adapter of an adaptable layer, lacks its other half, or
// whose shape does not fit its layer.
absl::Status SetAdapters(Transformer& model, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         double scaling, double dropout = 0);

// A folder holds an adapter when it has adapter_config.json.
bool HasAdapterFiles(const std::string& dir);

struct LoadedAdapter {
  LoraSpec spec;
  // AdapterParameters() names (PEFT's "base_model.model." prefix removed).
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

// Reads `dir`/adapter_config.json and adapter_model.safetensors. What PEFT
// can write but rlmesh does not compute is refused by name (INVALID_ARGUMENT
// "<dir>/adapter_config.json: use_dora: ..."): another peft_type, DoRA,
// bias other than "none", modules_to_save, layers_to_transform, rank or
// alpha patterns, fan_in_fan_out, target_modules as a pattern other than
// "all-linear".
absl::StatusOr<LoadedAdapter> ReadAdapter(const std::string& dir);

// Reads the adapter of `dir` into `model` (SetAdapters with its scaling and
// no dropout: a loaded adapter serves inference, or resumes a training run
// whose adapters are in place already, which keeps their dropout).
absl::Status LoadAdapter(const std::string& dir, Transformer& model);

// Writes `model`'s adapters into `dir` (which must exist) as PEFT does:
// adapter_model.safetensors (fp32, names prefixed "base_model.model.") and
// adapter_config.json (task CAUSAL_LM; base_model_name_or_path `base`, may
// be empty), each atomically. FAILED_PRECONDITION when it has none.
absl::Status SaveAdapter(Transformer& model, const LoraSpec& spec, const std::string& dir,
                         const std::string& base = "");

}  // namespace rlmesh::actor
