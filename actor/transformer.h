#pragma once

// The policy model: a Llama / Qwen2 / Qwen3-architecture decoder-only
// transformer in LibTorch. Parameter names are Hugging Face's (named_parameters() yields
// "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", ...,
// "lm_head.weight", "score.weight"), so checkpoints map 1:1.
//
// Not thread-safe: one thread drives a model at a time (modules hold no
// per-call state, but LibTorch modules are not meant for concurrent mutation).

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "actor/model_config.h"
#include "actor/threads.h"

namespace rlmesh::actor {

class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

// One factor of a LoRA adapter: a bare weight, so that its parameter is
// named "<linear>.lora_A.weight" / "<linear>.lora_B.weight" as PEFT names it.
class LoraFactorImpl : public torch::nn::Module {
 public:
  explicit LoraFactorImpl(torch::Tensor w);
  torch::Tensor weight;
};
TORCH_MODULE(LoraFactor);

// torch::nn::Linear (same parameters, same initialisation, so that a model
// seeded alike gets the same weights) that can carry a LoRA adapter:
//   y = x W^T + b + scaling * B(A(dropout(x)))
// with A [rank, in] and B [out, rank], as PEFT's LoRA layer computes it.
// Without an adapter, or with it disabled, it is the plain linear layer.
class LoraLinearImpl : public torch::nn::LinearImpl {
 public:
  explicit LoraLinearImpl(const torch::nn::LinearOptions& options) : torch::nn::LinearImpl(options) {}
  torch::Tensor forward(const torch::Tensor& x);
  // Replaces any adapter by A = `a`, B = `b` (registered as parameters;
  // they take their own requires_grad). `dropout` applies in training mode
  // only (is_training()). REQUIRES: a [r, in], b [out, r].
  void SetAdapter(torch::Tensor a, torch::Tensor b, double scaling, double dropout);
  void DropAdapter();
  bool has_adapter() const { return !lora_a_.is_empty(); }
  // Undefined without an adapter.
  torch::Tensor lora_A() const;
  torch::Tensor lora_B() const;
  double lora_scaling() const { return scaling_; }
  // A disabled adapter is skipped by forward (the base layer alone).
  void set_adapter_enabled(bool on) { enabled_ = on; }

 private:
  LoraFactor lora_a_{nullptr}, lora_b_{nullptr};
  double scaling_ = 1.0;
  double dropout_ = 0.0;
  bool enabled_ = true;
};
TORCH_MODULE(LoraLinear);

// Key/value cache of a batch of sequences during generation: one entry per
// layer, each [rows, num_kv_heads, capacity, head_dim], keys after RoPE.
// Row r holds positions [0, length(r)); the caller tracks lengths.
struct KvCache {
  std::vector<torch::Tensor> k;
  std::vector<torch::Tensor> v;
  int64_t rows() const { return k.empty() ? 0 : k[0].size(0); }
  int64_t capacity() const { return k.empty() ? 0 : k[0].size(2); }
  // Rows [0, n), as views: what a decoding step reads and writes.
  KvCache FirstRows(int64_t n) const {
    KvCache view;
    for (size_t i = 0; i < k.size(); ++i) {
      view.k.push_back(k[i].narrow(0, 0, n));
      view.v.push_back(v[i].narrow(0, 0, n));
    }
    return view;
  }
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& c);
  // Full (causal) attention over x [B,T,H]. cos/sin [B,T,D]. `mask` is an
  // optional bool [B,1,T,T] (true = may attend); undefined = causal.
  // When `k_out`/`v_out` are non-null they receive [B,kv,T,D].
  torch::Tensor Full(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     const torch::Tensor& mask, torch::Tensor* k_out, torch::Tensor* v_out);
  // One new token per row: x [N,1,H]; writes its k/v at `lens` [N] into the
  // cache tensors and attends to positions [0, lens[r]].
  torch::Tensor Decode(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                       torch::Tensor& k_cache, torch::Tensor& v_cache, const torch::Tensor& lens,
                       const torch::Tensor& key_mask, int64_t used);

  // [B, T, heads, D] projections of x [B, T, H], QK-normed where the model
  // has it, RoPE'd with cos/sin [B, T, D] (a layout that runs the attention
  // itself, learner/context_parallel.cc, takes them from here).
  torch::Tensor Queries(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  torch::Tensor Keys(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

  LoraLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // Qwen3's per-head RMSNorm on q and k (null elsewhere).
  RmsNorm q_norm{nullptr}, k_norm{nullptr};

 private:
  int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  // SwiGLU of width `width` (0 = c.intermediate_size).
  explicit MlpImpl(const ModelConfig& c, int64_t width = 0);
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

// The routing of a model's MoE layers over one call, for the caller that
// records or replays it: set it on the model (TransformerImpl::set_routing)
// around the call. Entry i is the i-th MoE layer; tokens are the call's
// flattened rows ([B*T] for ForwardHidden and Prefill, [N] for DecodeStep).
struct MoeRouting {
  // Expert ids [tokens, k] int64 to use instead of the router's top-k (the
  // weights still come from the router's probabilities at those experts); a
  // row of -1 lets the router choose for that token. Empty = route. Either
  // empty or one tensor per MoE layer.
  std::vector<torch::Tensor> replay;
  // When true, `chosen` and `router_logits` receive each MoE layer's expert
  // ids [tokens, k] and router logits [tokens, E] (with autograd history,
  // for LoadBalancingLoss).
  bool record = false;
  std::vector<torch::Tensor> chosen;
  std::vector<torch::Tensor> router_logits;
};

// Qwen3-MoE's sparse block: softmax router (fp32), top-k experts, weights
// renormalised when norm_topk_prob, each expert a SwiGLU MLP. Hugging Face
// names: "gate" (the router) and "experts.<e>.{gate,up,down}_proj". Qwen2-MoE
// adds a shared expert every token goes through, scaled by a sigmoid gate:
// "shared_expert.{gate,up,down}_proj" and "shared_expert_gate" ([1, H]).
class MoeImpl : public torch::nn::Module {
 public:
  // The routed experts' part of forward: tokens [N, H], their experts
  // [N, k] (int64) and routing weights [N, k] -> the weighted sum of the
  // chosen experts' outputs, [N, H], accumulated expert by expert in
  // ascending order. Replaceable (set_experts) so that expert parallelism
  // (learner/expert_parallel.h) can run the experts on other ranks.
  using ExpertsFn = std::function<torch::Tensor(MoeImpl& moe, const torch::Tensor& tokens, const torch::Tensor& idx,
                                                const torch::Tensor& weights)>;

  explicit MoeImpl(const ModelConfig& c);
  // x [.., H] -> [.., H]. `replay` [tokens, k] or undefined; `chosen` and
  // `logits` receive the routing when non-null.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& replay, torch::Tensor* chosen,
                        torch::Tensor* logits);
  // This process's experts on the tokens routed to them: the default
  // ExpertsFn.
  torch::Tensor RunExperts(const torch::Tensor& tokens, const torch::Tensor& idx, const torch::Tensor& weights);
  void set_experts(ExpertsFn fn) { experts_fn_ = std::move(fn); }
  torch::nn::Linear gate{nullptr};
  torch::nn::ModuleList experts{nullptr};
  // Qwen2-MoE with shared_expert_intermediate_size > 0 (null otherwise).
  Mlp shared_expert{nullptr};
  torch::nn::Linear shared_expert_gate{nullptr};

 private:
  int64_t top_k_;
  bool norm_topk_;
  ExpertsFn experts_fn_;
};
TORCH_MODULE(Moe);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  // `moe_index`: this layer's index among the MoE layers, -1 = dense.
  DecoderLayerImpl(const ModelConfig& c, int64_t moe_index);
  // The feed-forward part (dense MLP or MoE) under "mlp".
  torch::Tensor Ffn(const torch::Tensor& x, MoeRouting* routing);
  // The whole block on the residual stream h [B,T,H] (see
  // AttentionImpl::Full for cos, sin and mask): h + attention, then + FFN.
  torch::Tensor Forward(const torch::Tensor& h, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& mask, MoeRouting* routing);
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};  // dense layers
  Moe moe{nullptr};  // MoE layers (registered as "mlp")
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};

 private:
  int64_t moe_index_;
};
TORCH_MODULE(DecoderLayer);

// Runs block(h) as one activation-checkpointed autograd node when the call
// builds a graph through h (see TransformerImpl::
// set_activation_checkpointing), else plainly. `block` is run again in the
// backward pass: it must compute the same thing then, so it captures what it
// reads by value, and every process of a group that runs collectives in it
// must recompute too.
torch::Tensor CheckpointedBlock(std::function<torch::Tensor(const torch::Tensor&)> block, const torch::Tensor& h);

// How many times in this process a CheckpointedBlock has run its block again
// in a backward pass: what tests and benchmarks read to see that a layout
// did checkpoint. Thread-safe.
int64_t CheckpointedBlockReruns();

// MoeRouting.replay for a right-padded batch [rows, T] from each row's
// recorded routes (Completion.routes: [position][moe layer][k] flattened);
// positions past a row's routes (its last token, padding) route freely.
// REQUIRES: each row's routes cover at most T positions of c's MoE layers.
std::vector<torch::Tensor> RoutesToReplay(const std::vector<std::vector<int32_t>>& rows, int64_t T,
                                          const ModelConfig& c);

// transformers' load-balancing auxiliary loss (Switch Transformer style) over
// the router logits of every MoE layer: num_experts * sum_e (fraction of
// top-k assignments to e) * (mean router probability of e), counted over the
// tokens where `mask` [tokens] is nonzero (undefined = all). Not scaled by
// router_aux_loss_coef.
torch::Tensor LoadBalancingLoss(const std::vector<torch::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                                const torch::Tensor& mask = {});

// The "model." prefix of Hugging Face's names.
class BackboneImpl : public torch::nn::Module {
 public:
  explicit BackboneImpl(const ModelConfig& c);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};
};
TORCH_MODULE(Backbone);

class TransformerImpl : public torch::nn::Module {
 public:
  // REQUIRES: config.Validate().ok(). Weights are initialised as
  // transformers does (normal(0, 0.02), zero biases, unit norms) from
  // LibTorch's global generator (seed it with torch::manual_seed).
  explicit TransformerImpl(const ModelConfig& config);

  // input_ids, position_ids: [B,T] int64 -> logits [B,T,V].
  torch::Tensor Forward(const torch::Tensor& input_ids, const torch::Tensor& position_ids);
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& position_ids) {
    return Forward(input_ids, position_ids);
  }
  // Final-norm hidden states [B,T,H]. `attention_mask` [B,T] (1/true = real
  // token) hides padding keys; undefined means every token is real. An
  // integer mask holds segment ids instead (packing several sequences in a
  // row): a query attends only to keys of its own segment, 0 = padding;
  // position_ids then restart at each segment. Causal either way; a padded
  // query still sees itself (its output is garbage the caller ignores, never
  // NaN).
  torch::Tensor ForwardHidden(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                              const torch::Tensor& attention_mask = {});
  // Hidden states -> logits (lm_head, or the embedding when tied).
  torch::Tensor Logits(const torch::Tensor& hidden);
  // The [V,H] output projection (the embedding weight when tied).
  torch::Tensor LmHeadWeight();
  // Scalar head on every position: [B,T]. REQUIRES: config().value_head.
  torch::Tensor Values(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                       const torch::Tensor& attention_mask = {});
  torch::Tensor ValuesFromHidden(const torch::Tensor& hidden);

  // Generation. Prefill runs the prompts [B,T] (right-padded; row r's real
  // tokens are [0, lens[r])) and returns the hidden state [B,H] at each row's
  // last real token and a cache with `capacity` >= T slots.
  torch::Tensor Prefill(const torch::Tensor& input_ids, const torch::Tensor& lens, int64_t capacity,
                        KvCache* cache);
  // Feeds one token per cache row: ids [N], lens [N] (tokens already in the
  // cache = the new token's position). Returns hidden [N,H]. REQUIRES:
  // max(lens) < cache->capacity(); `max_len` = max(lens) (saves a sync).
  torch::Tensor DecodeStep(const torch::Tensor& ids, const torch::Tensor& lens, int64_t max_len,
                           KvCache* cache);

  // Parameters under their Hugging Face names (tied lm_head is absent, as in
  // the files transformers writes). LoRA adapters are not among them: they
  // are AdapterParameters().
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() const;
  // The LoRA adapters' parameters, "<linear>.lora_A.weight" then
  // "<linear>.lora_B.weight" for each linear layer that carries one, in
  // module order (PEFT's names without its "base_model.model." prefix).
  std::vector<std::pair<std::string, torch::Tensor>> AdapterParameters() const;
  // The linear layers that can carry an adapter (attention and dense MLP
  // projections; the routed experts and heads cannot), under their Hugging
  // Face module names ("model.layers.0.self_attn.q_proj").
  std::vector<std::pair<std::string, LoraLinear>> AdaptableLinears() const;
  // Turns every adapter's contribution off (the base model) or on.
  void SetAdaptersEnabled(bool on);

  const ModelConfig& config() const { return config_; }

  // The routing record/replay the MoE layers use on the following calls;
  // null (the default) routes freely and records nothing. Not owned.
  void set_routing(MoeRouting* routing) { routing_ = routing; }

  // Activation (gradient) checkpointing: when on, a ForwardHidden that
  // builds a graph keeps only each decoder block's input, and the backward
  // pass runs the block's forward again (with the autocast state it first
  // ran under) to get its gradients. Less memory for one more forward of
  // the blocks; the gradients are the same. Default off. REQUIRES: no MoE
  // layer (their routing record would see every block twice).
  void set_activation_checkpointing(bool on);
  bool activation_checkpointing() const { return checkpoint_blocks_; }

  Backbone model{nullptr};
  torch::nn::Linear lm_head{nullptr};
  torch::nn::Linear score{nullptr};

 private:
  // cos/sin [.., D] for int64 positions of any shape, in `dtype`.
  std::pair<torch::Tensor, torch::Tensor> Rope(const torch::Tensor& positions, c10::ScalarType dtype);

  ModelConfig config_;
  torch::Tensor inv_freq_;     // [D/2] fp32, not a parameter (see rope.h).
  // inv_freq_ on the device of the last positions off the CPU: a decode
  // step then copies nothing from the host (which a CUDA graph forbids).
  torch::Tensor inv_freq_on_device_;
  double rope_scaling_ = 1.0;  // on cos/sin (yarn)
  MoeRouting* routing_ = nullptr;
  bool checkpoint_blocks_ = false;
};
TORCH_MODULE(Transformer);

}  // namespace rlmesh::actor
