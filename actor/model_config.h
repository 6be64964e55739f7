#pragma once

// The shape of a decoder-only transformer, in the vocabulary of Hugging Face's
// LlamaConfig / Qwen2Config / Qwen3Config. Loads from and saves to a config.json so that a
// folder we write opens in `transformers` and a public folder opens here.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlmesh::actor {

// How RoPE's inverse frequencies are scaled for contexts longer than the
// pretraining one: transformers' `rope_parameters` (5.x) / `rope_scaling`
// (4.x). Each type computes the same fp32 frequencies and attention scaling
// as transformers' ROPE_INIT_FUNCTIONS; other types are refused by name.
struct RopeScaling {
  // "default" (none), "linear", "dynamic" (NTK, recomputed from the sequence
  // length when it exceeds max_positions), "llama3" or "yarn". Default
  // "default".
  std::string type = "default";
  // Context stretch; linear, dynamic, llama3, yarn. Default 1.
  double factor = 1.0;
  // llama3, yarn: the pretraining context; 0 = max_positions. Default 0.
  int64_t original_max_positions = 0;
  // llama3: wavelength band edges as fractions of the original context.
  // Defaults 1 and 4 (Llama 3.1's values).
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // yarn: the ramp between extrapolated and interpolated dimensions, in
  // rotations. Defaults 32 and 1.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  // yarn: multiplier on cos/sin; 0 = derived from factor (and mscale,
  // mscale_all_dim when both are set). Default 0.
  double attention_factor = 0.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  // yarn: round the ramp's ends to whole dimensions. Default true.
  bool truncate = true;
};

struct ModelConfig {
  // "llama", "qwen2", "qwen3", "qwen3_moe" or "qwen2_moe". qwen2 implies
  // q/k/v bias (never o); qwen2_moe has q/k/v bias when qkv_bias (config.json
  // "qwen2_moe"'s `qkv_bias`, default true), never o; qwen3 and qwen3_moe
  // imply per-head RMSNorm on q and k (QK-norm); the MoE archs replace the
  // MLP of their MoE layers by routed experts (qwen2_moe: plus a shared
  // expert behind a sigmoid gate). Default "llama".
  std::string arch = "llama";
  // Tokens in the vocabulary (rows of the embedding). Default 64.
  int64_t vocab_size = 64;
  // Width of the residual stream. Default 256.
  int64_t hidden_size = 256;
  // Width of the SwiGLU MLP. Default 688 (~8/3 * hidden, as Llama rounds).
  int64_t intermediate_size = 688;
  // Decoder layers. Default 4.
  int64_t num_layers = 4;
  // Query heads. Default 4.
  int64_t num_heads = 4;
  // Key/value heads (grouped-query attention); must divide num_heads.
  // Default 4.
  int64_t num_kv_heads = 4;
  // Per-head width; 0 = hidden_size / num_heads. Default 0.
  int64_t head_dim = 0;
  // Longest sequence (prompt + completion) in tokens. Default 256.
  int64_t max_positions = 256;
  // RoPE base frequency. Default 10000.
  double rope_theta = 10000.0;
  // RoPE scaling for long contexts. Default none.
  RopeScaling rope;
  // RMSNorm epsilon. Default 1e-6.
  double rms_norm_eps = 1e-6;
  // lm_head shares the input embedding's weight. Default false.
  bool tie_embeddings = false;
  // Bias on the attention projections: config.json's "attention_bias" (Llama,
  // Qwen3: q/k/v and o). Qwen2 always has q/k/v bias and never o bias.
  // Default false.
  bool qkv_bias = false;
  // Adds a scalar head ("score.weight", [1, hidden], as in HF's
  // *ForSequenceClassification with num_labels=1): critic / reward model.
  // Default false.
  bool value_head = false;
  // Mixture of experts (qwen3_moe, qwen2_moe): experts per MoE layer, experts per
  // token (top-k), each expert's MLP width, whether the top-k weights are
  // renormalised to sum to 1, every how many layers a layer is MoE (layer i
  // when (i+1) % decoder_sparse_step == 0), layers kept dense, and the
  // load-balancing loss weight. Defaults: 0 (dense), 0, 0, false, 1, none,
  // 0.001. `output_router_logits`: whether transformers adds the
  // load-balancing loss (times router_aux_loss_coef) to a training loss;
  // the learner's default for rl.router_aux_loss_coef. Default false.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;
  // qwen2_moe: width of the shared expert every token also goes through
  // (weighted by sigmoid(shared_expert_gate(x))); 0 = none. Default 0.
  int64_t shared_expert_intermediate_size = 0;
  // Special token ids written to config.json; -1 = none. Default -1.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;

  // Per-head width actually used.
  int64_t HeadDim() const { return head_dim > 0 ? head_dim : hidden_size / num_heads; }
  // Whether q/k/v carry a bias (always for qwen2).
  bool HasQkvBias() const { return qkv_bias || arch == "qwen2"; }
  // Whether o_proj carries a bias (attention_bias outside the Qwen2 family).
  bool HasOBias() const { return qkv_bias && arch != "qwen2" && arch != "qwen2_moe"; }
  // Whether the architecture has routed experts (qwen3_moe, qwen2_moe).
  bool IsMoeArch() const { return arch == "qwen3_moe" || arch == "qwen2_moe"; }
  // Per-head RMSNorm on q and k before RoPE (qwen3, qwen3_moe).
  bool HasQkNorm() const { return arch == "qwen3" || arch == "qwen3_moe"; }
  // Whether decoder layer `layer` routes its MLP through experts.
  bool IsMoeLayer(int64_t layer) const;
  // How many layers are MoE layers.
  int64_t NumMoeLayers() const;

  // INVALID_ARGUMENT naming the field when a value is out of range.
  absl::Status Validate() const;

  // Parses a Hugging Face config.json (LlamaConfig / Qwen2Config /
  // Qwen3Config, both the transformers 4.x "rope_theta"/"rope_scaling" and
  // 5.x "rope_parameters" spellings).
  static absl::StatusOr<ModelConfig> FromHfConfigJson(const std::string& path);
  static absl::StatusOr<ModelConfig> FromHfConfigJsonString(const std::string& text);

  // The config.json text `transformers` reads back into the same model.
  // `dtype` is "float32", "bfloat16" or "float16" (recorded, not applied).
  std::string ToHfConfigJson(const std::string& dtype = "float32") const;

 private:
  static absl::StatusOr<ModelConfig> FromHfConfigJsonInternal(const std::string& text);
};

// Llama's default MLP width for a hidden size: 8/3 * hidden rounded up to a
// multiple of 32.
int64_t DefaultIntermediateSize(int64_t hidden_size);

}  // namespace rlmesh::actor
