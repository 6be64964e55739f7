#pragma once

// Hugging Face model folders: config.json + model.safetensors, or sharded
// model-0000i-of-0000n.safetensors with model.safetensors.index.json, plus
// generation_config.json and (given the tokenizer) tokenizer.json and
// tokenizer_config.json. Tensor names are Hugging Face's, so a folder written
// here opens with AutoModelForCausalLM / AutoTokenizer.from_pretrained and a
// public Llama/Qwen2/Qwen3 folder opens here.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "actor/model_config.h"
#include "actor/safetensors.h"
#include "actor/tokenizer.h"
#include "actor/transformer_fwd.h"

namespace rlmesh::actor {

struct LoadOptions {
  // Parameter dtype after loading: "fp32", "bf16" or "fp16". Default "fp32".
  std::string dtype = "fp32";
  // "cpu" or "cuda[:i]". Default "cpu".
  std::string device = "cpu";
  // Build the model with a scalar value head even if config.json has none
  // (a critic initialised from a policy). Default false.
  bool add_value_head = false;
  // A value head absent from the files keeps its fresh initialisation
  // instead of failing (critic from a policy checkpoint). Default false.
  bool allow_missing_value_head = false;
  // Tensors in the files that the model does not have are an error (default
  // false: they are skipped, e.g. a reward model's score.weight read as a
  // policy).
  bool strict = false;
  // A folder that also holds a LoRA adapter (adapter_config.json, as
  // SaveHfModel writes for a model with adapters; actor/lora.h) loads it
  // onto the model's linear layers; with merge_adapter it is added into the
  // base weights instead (the same function, no adapter left). Default
  // false.
  bool merge_adapter = false;

  absl::Status Validate() const;
};

struct SaveOptions {
  // Stored dtype: "fp32", "bf16" or "fp16". Default "fp32".
  std::string dtype = "fp32";
  // Split into shards of at most this many bytes (plus one tensor); 0 = one
  // model.safetensors. Default 0.
  int64_t max_shard_bytes = 0;
  // The model's tokenizer, written as tokenizer.json + tokenizer_config.json
  // so the folder is complete for Hugging Face tools; null writes none.
  // Not owned. Default null.
  const Tokenizer* tokenizer = nullptr;

  absl::Status Validate() const;
};

// Reads config.json and the weights of `dir` into a new model.
// Errors name the file and the tensor (missing, shape mismatch, corrupt).
absl::StatusOr<Transformer> LoadHfModel(const std::string& dir, const LoadOptions& options = {});

// Copies the weights of `dir` into an existing model (shapes must match),
// and its adapter, when it holds one (LoadOptions.merge_adapter).
absl::Status LoadHfWeights(const std::string& dir, Transformer& model, const LoadOptions& options = {});

// Writes config.json, generation_config.json, the tokenizer files when given
// and safetensors (each file atomically) into `dir`, creating it; a model
// with LoRA adapters also gets PEFT's adapter files (actor/lora.h), beside
// its base weights. Stale files of the other layout (single vs. sharded, an
// adapter of an earlier save) are removed so the folder has one meaning.
absl::Status SaveHfModel(Transformer& model, const std::string& dir, const SaveOptions& options = {});

// SaveHfModel for weights that arrive one part at a time (a model gathered
// unit by unit, learner/fully_sharded.h): writes the folder's other files,
// then returns the writer of its model.safetensors, laid out from `shapes`
// (Hugging Face names, in the order the caller will append them; stored as
// options.dtype). The caller appends every tensor and commits; the folder
// is then what SaveHfModel writes for the same weights. INVALID_ARGUMENT
// for options.max_shard_bytes != 0 (one file only).
absl::StatusOr<std::unique_ptr<SafetensorsWriter>> OpenHfModelWriter(
    const ModelConfig& config, const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
    const std::string& dir, const SaveOptions& options = {});

}  // namespace rlmesh::actor
