#include "actor/transformer.h"

#include <atomic>
#include <cmath>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>

#include "actor/attention_inputs.h"
#include "actor/autocast.h"
#include "actor/rope.h"

namespace rlmesh::actor {

namespace idx = torch::indexing;

void ConfigureThreads(int n) {
  if (n <= 0) n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(n);
}

namespace {

// rotate_half as in the reference: [-x2, x1].
torch::Tensor RotateHalf(const torch::Tensor& x) {
  int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x [B,T,heads,D], cos/sin [B,T,D].
torch::Tensor ApplyRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto c = cos.unsqueeze(2);
  auto s = sin.unsqueeze(2);
  return x * c + RotateHalf(x) * s;
}

}  // namespace

RmsNormImpl::RmsNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  // Statistics in fp32, scale applied after casting back (as transformers).
  auto h = x.to(torch::kFloat32);
  auto var = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(var + eps_);
  return weight * h.to(x.scalar_type());
}

LoraFactorImpl::LoraFactorImpl(torch::Tensor w) { weight = register_parameter("weight", std::move(w)); }

torch::Tensor LoraLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::nn::LinearImpl::forward(x);
  if (lora_a_.is_empty() || !enabled_) return y;
  torch::Tensor in = x;
  if (dropout_ > 0 && is_training()) in = torch::dropout(in, dropout_, /*train=*/true);
  return y + torch::linear(torch::linear(in, lora_a_->weight), lora_b_->weight) * scaling_;
}

void LoraLinearImpl::SetAdapter(torch::Tensor a, torch::Tensor b, double scaling, double dropout) {
  DropAdapter();
  lora_a_ = register_module("lora_A", LoraFactor(std::move(a)));
  lora_b_ = register_module("lora_B", LoraFactor(std::move(b)));
  scaling_ = scaling;
  dropout_ = dropout;
}

void LoraLinearImpl::DropAdapter() {
  if (lora_a_.is_empty()) return;
  unregister_module("lora_A");
  unregister_module("lora_B");
  lora_a_ = nullptr;
  lora_b_ = nullptr;
}

torch::Tensor LoraLinearImpl::lora_A() const { return lora_a_ ? lora_a_->weight : torch::Tensor(); }
torch::Tensor LoraLinearImpl::lora_B() const { return lora_b_ ? lora_b_->weight : torch::Tensor(); }

AttentionImpl::AttentionImpl(const ModelConfig& c)
    : heads_(c.num_heads), kv_heads_(c.num_kv_heads), head_dim_(c.HeadDim()) {
  bool bias = c.HasQkvBias();
  q_proj =
      register_module("q_proj", LoraLinear(torch::nn::LinearOptions(c.hidden_size, heads_ * head_dim_).bias(bias)));
  k_proj = register_module("k_proj",
                           LoraLinear(torch::nn::LinearOptions(c.hidden_size, kv_heads_ * head_dim_).bias(bias)));
  v_proj = register_module("v_proj",
                           LoraLinear(torch::nn::LinearOptions(c.hidden_size, kv_heads_ * head_dim_).bias(bias)));
  o_proj = register_module(
      "o_proj", LoraLinear(torch::nn::LinearOptions(heads_ * head_dim_, c.hidden_size).bias(c.HasOBias())));
  if (c.HasQkNorm()) {
    q_norm = register_module("q_norm", RmsNorm(head_dim_, c.rms_norm_eps));
    k_norm = register_module("k_norm", RmsNorm(head_dim_, c.rms_norm_eps));
  }
}

torch::Tensor AttentionImpl::Queries(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto q = q_proj(x).view({x.size(0), x.size(1), heads_, head_dim_});
  if (q_norm) q = q_norm(q);
  return ApplyRope(q, cos, sin);
}

torch::Tensor AttentionImpl::Keys(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto k = k_proj(x).view({x.size(0), x.size(1), kv_heads_, head_dim_});
  if (k_norm) k = k_norm(k);
  return ApplyRope(k, cos, sin);
}

torch::Tensor AttentionImpl::Full(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                  const torch::Tensor& mask, torch::Tensor* k_out, torch::Tensor* v_out) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = Queries(x, cos, sin).transpose(1, 2);
  auto k = Keys(x, cos, sin).transpose(1, 2);
  auto v = v_proj(x).view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
  if (k_out != nullptr) *k_out = k;
  if (v_out != nullptr) *v_out = v;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  torch::Tensor out;
  if (mask.defined()) {
    out = at::scaled_dot_product_attention(q, k, v, mask, 0.0, /*is_causal=*/false, scale, /*enable_gqa=*/true);
  } else {
    out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale, /*enable_gqa=*/true);
  }
  return o_proj(out.transpose(1, 2).reshape({B, T, heads_ * head_dim_}));
}

torch::Tensor AttentionImpl::Decode(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                    torch::Tensor& k_cache, torch::Tensor& v_cache, const torch::Tensor& lens,
                                    const torch::Tensor& key_mask, int64_t used) {
  const int64_t N = x.size(0);
  const int64_t groups = heads_ / kv_heads_;
  auto q = Queries(x, cos, sin);  // [N,1,H,D]
  auto k = Keys(x, cos, sin);     // [N,1,kv,D]
  auto v = v_proj(x).view({N, 1, kv_heads_, head_dim_});
  auto rows = torch::arange(N, lens.options());
  // Non-adjacent advanced indices put the indexed dim first: value [N,kv,D].
  k_cache.index_put_({rows, idx::Slice(), lens}, k.squeeze(1));
  v_cache.index_put_({rows, idx::Slice(), lens}, v.squeeze(1));
  auto kc = k_cache.narrow(2, 0, used);  // [N,kv,L,D]
  auto vc = v_cache.narrow(2, 0, used);
  // Query heads grouped under their kv head: [N,kv,g,D].
  auto qg = q.view({N, kv_heads_, groups, head_dim_});
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  auto scores = torch::matmul(qg, kc.transpose(-1, -2)).to(torch::kFloat32) * scale;  // [N,kv,g,L]
  scores = scores.masked_fill(key_mask.logical_not(), -std::numeric_limits<float>::infinity());
  auto p = torch::softmax(scores, -1).to(x.scalar_type());
  auto out = torch::matmul(p, vc);  // [N,kv,g,D]
  return o_proj(out.reshape({N, 1, heads_ * head_dim_}));
}

MlpImpl::MlpImpl(const ModelConfig& c, int64_t width) {
  if (width <= 0) width = c.intermediate_size;
  auto lin = [](int64_t i, int64_t o) { return LoraLinear(torch::nn::LinearOptions(i, o).bias(false)); };
  gate_proj = register_module("gate_proj", lin(c.hidden_size, width));
  up_proj = register_module("up_proj", lin(c.hidden_size, width));
  down_proj = register_module("down_proj", lin(width, c.hidden_size));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

MoeImpl::MoeImpl(const ModelConfig& c) : top_k_(c.num_experts_per_tok), norm_topk_(c.norm_topk_prob) {
  gate = register_module("gate",
                         torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.num_experts).bias(false)));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < c.num_experts; ++e) experts->push_back(Mlp(c, c.moe_intermediate_size));
  if (c.shared_expert_intermediate_size > 0) {
    shared_expert = register_module("shared_expert", Mlp(c, c.shared_expert_intermediate_size));
    shared_expert_gate = register_module(
        "shared_expert_gate", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, 1).bias(false)));
  }
}

torch::Tensor MoeImpl::forward(const torch::Tensor& x, const torch::Tensor& replay, torch::Tensor* chosen,
                               torch::Tensor* logits_out) {
  auto flat = x.reshape({-1, x.size(-1)});
  auto logits = gate(flat);  // [N,E]
  auto probs = torch::softmax(logits, -1, torch::kFloat32);
  torch::Tensor weights, idx;
  if (replay.defined()) {
    TORCH_CHECK(replay.dim() == 2 && replay.size(0) == flat.size(0) && replay.size(1) == top_k_,
                "MoE routing replay: expected [", flat.size(0), ", ", top_k_, "] expert ids, got ", replay.sizes());
    auto given = replay.to(flat.device(), torch::kLong);
    TORCH_CHECK(given.numel() == 0 || (given.min().item<int64_t>() >= -1 &&
                                       given.max().item<int64_t>() < static_cast<int64_t>(experts->size())),
                "MoE routing replay: expert id out of range [-1, ", experts->size(), ")");
    auto free = given.lt(0).any(-1, /*keepdim=*/true);  // [N,1]: the router chooses
    idx = torch::where(free, std::get<1>(probs.topk(top_k_, -1)), given);
    weights = probs.gather(1, idx);
  } else {
    std::tie(weights, idx) = probs.topk(top_k_, -1);
  }
  if (norm_topk_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(logits.scalar_type());
  if (chosen != nullptr) *chosen = idx;
  if (logits_out != nullptr) *logits_out = logits;
  auto out = experts_fn_ ? experts_fn_(*this, flat, idx, weights) : RunExperts(flat, idx, weights);
  if (shared_expert) out = out + torch::sigmoid(shared_expert_gate(flat)) * shared_expert(flat);
  return out.view(x.sizes());
}

torch::Tensor MoeImpl::RunExperts(const torch::Tensor& flat, const torch::Tensor& idx, const torch::Tensor& weights) {
  auto out = torch::zeros_like(flat);
  // Expert by expert in ascending order, as transformers accumulates.
  for (int64_t e = 0; e < static_cast<int64_t>(experts->size()); ++e) {
    auto hits = idx.eq(e).nonzero();  // [M,2]: (token, slot)
    if (hits.size(0) == 0) continue;
    auto tokens = hits.select(1, 0);
    auto slots = hits.select(1, 1);
    auto y = experts[e]->as<MlpImpl>()->forward(flat.index_select(0, tokens));
    y = y * weights.index({tokens, slots}).unsqueeze(-1);
    out.index_add_(0, tokens, y.to(out.scalar_type()));
  }
  return out;
}

torch::Tensor LoadBalancingLoss(const std::vector<torch::Tensor>& router_logits, int64_t num_experts, int64_t top_k,
                                const torch::Tensor& mask) {
  TORCH_CHECK(!router_logits.empty(), "LoadBalancingLoss: no router logits");
  const auto device = router_logits[0].device();
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto assignments = torch::zeros({num_experts}, opts);
  auto prob_sum = torch::zeros({num_experts}, opts);
  torch::Tensor rows = torch::zeros({}, opts);
  torch::Tensor m = mask.defined() ? mask.reshape({-1}).to(opts) : torch::Tensor();
  for (const auto& logits : router_logits) {
    auto probs = torch::softmax(logits.to(torch::kFloat32), -1);
    auto selected = std::get<1>(probs.topk(top_k, -1));
    auto w = m.defined() ? m : torch::ones({probs.size(0)}, opts);
    assignments = assignments + torch::zeros({num_experts}, opts)
                                    .scatter_add_(0, selected.reshape({-1}), w.repeat_interleave(top_k));
    prob_sum = prob_sum + (probs * w.unsqueeze(-1)).sum(0);
    rows = rows + w.sum();
  }
  return (assignments / rows * (prob_sum / rows)).sum() * static_cast<double>(num_experts);
}

std::vector<torch::Tensor> RoutesToReplay(const std::vector<std::vector<int32_t>>& rows, int64_t T,
                                          const ModelConfig& c) {
  const int64_t L = c.NumMoeLayers(), k = c.num_experts_per_tok, B = static_cast<int64_t>(rows.size());
  auto all = torch::full({B, T, L, k}, -1, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const auto& r = rows[b];
    const int64_t n = static_cast<int64_t>(r.size());
    TORCH_CHECK(L > 0 && n % (L * k) == 0 && n / (L * k) <= T, "RoutesToReplay: row ", b, " has ", n,
                " expert ids, not a multiple of ", L, " layers x ", k, " within ", T, " positions");
    if (n == 0) continue;
    auto src = torch::from_blob(const_cast<int32_t*>(r.data()), {n / (L * k), L, k}, torch::kInt32);
    all[b].narrow(0, 0, n / (L * k)).copy_(src);
  }
  all = all.view({B * T, L, k});
  std::vector<torch::Tensor> out;
  for (int64_t l = 0; l < L; ++l) out.push_back(all.select(1, l).contiguous());
  return out;
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, int64_t moe_index) : moe_index_(moe_index) {
  self_attn = register_module("self_attn", Attention(c));
  if (moe_index >= 0) {
    moe = register_module("mlp", Moe(c));
  } else {
    mlp = register_module("mlp", Mlp(c));
  }
  input_layernorm = register_module("input_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::Forward(const torch::Tensor& h, const torch::Tensor& cos, const torch::Tensor& sin,
                                        const torch::Tensor& mask, MoeRouting* routing) {
  torch::Tensor x = h + self_attn->Full(input_layernorm(h), cos, sin, mask, nullptr, nullptr);
  return x + Ffn(post_attention_layernorm(x), routing);
}

torch::Tensor DecoderLayerImpl::Ffn(const torch::Tensor& x, MoeRouting* routing) {
  if (!moe) return mlp(x);
  const size_t i = static_cast<size_t>(moe_index_);
  torch::Tensor replay;
  if (routing != nullptr && !routing->replay.empty()) {
    TORCH_CHECK(i < routing->replay.size(), "MoE routing replay: ", routing->replay.size(),
                " layers given, the model has more");
    replay = routing->replay[i];
  }
  const bool record = routing != nullptr && routing->record;
  torch::Tensor chosen, logits;
  auto y = moe(x, replay, record ? &chosen : nullptr, record ? &logits : nullptr);
  if (record) {
    if (routing->chosen.size() <= i) routing->chosen.resize(i + 1);
    if (routing->router_logits.size() <= i) routing->router_logits.resize(i + 1);
    routing->chosen[i] = chosen;
    routing->router_logits[i] = logits;
  }
  return y;
}

namespace {

std::atomic<int64_t> block_reruns{0};

// A block's forward as a callable the backward can run again.
struct BlockHolder : torch::CustomClassHolder {
  explicit BlockHolder(std::function<torch::Tensor(const torch::Tensor&)> f) : fn(std::move(f)) {}
  std::function<torch::Tensor(const torch::Tensor&)> fn;
};

// One block as an autograd node that keeps only its input: the forward runs
// the block without a graph; the backward runs it again with one, under the
// autocast state of the first run, and back-propagates through it. The
// parameters' gradients accumulate into their .grad there (a backward
// inside the backward, as PyTorch's reentrant checkpoint does), so they are
// not outputs of this node; the input's gradient is.
struct CheckpointedBlockFunction : public torch::autograd::Function<CheckpointedBlockFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<BlockHolder> block, const torch::Tensor& h) {
    ctx->saved_data["block"] = c10::IValue::make_capsule(block);
    ctx->saved_data["autocast"] = AutocastState::Current(h.device().type()).Encode();
    ctx->save_for_backward({h});
    return {block->fn(h)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto block = c10::static_intrusive_pointer_cast<BlockHolder>(ctx->saved_data["block"].toCapsule());
    const AutocastState autocast = AutocastState::Decode(ctx->saved_data["autocast"].toInt());
    torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    {
      torch::AutoGradMode grad(true);
      torch::Tensor out;
      {
        // Autocast covers the recomputed forward only; the backward through
        // it runs outside autocast, as every backward pass does.
        AutocastScope scope(x.device().type(), autocast);
        out = block->fn(x);
      }
      torch::autograd::backward({out}, {grad_out[0]});
    }
    block_reruns.fetch_add(1, std::memory_order_relaxed);
    // One gradient per argument: block, h.
    return {torch::Tensor(), x.grad()};
  }
};

}  // namespace

BackboneImpl::BackboneImpl(const ModelConfig& c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  int64_t moe_index = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) layers->push_back(DecoderLayer(c, c.IsMoeLayer(i) ? moe_index++ : -1));
  norm = register_module("norm", RmsNorm(c.hidden_size, c.rms_norm_eps));
}

TransformerImpl::TransformerImpl(const ModelConfig& config) : config_(config) {
  model = register_module("model", Backbone(config));
  if (!config.tie_embeddings) {
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
  }
  if (config.value_head) {
    score = register_module("score",
                            torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, 1).bias(false)));
  }
  // Kept out of the buffers so that model->to(bf16) leaves it fp32.
  RopeFrequencies rope = ComputeRope(config);
  inv_freq_ = rope.inv_freq;
  rope_scaling_ = rope.scaling;

  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.value().zero_();
    } else if (name.find("norm") != std::string::npos) {
      p.value().fill_(1.0);
    } else {
      p.value().normal_(0.0, 0.02);
    }
  }
}

std::pair<torch::Tensor, torch::Tensor> TransformerImpl::Rope(const torch::Tensor& positions,
                                                              c10::ScalarType dtype) {
  torch::Tensor inv = inv_freq_;
  if (positions.device() != inv_freq_.device()) {
    if (!inv_freq_on_device_.defined() || inv_freq_on_device_.device() != positions.device()) {
      inv_freq_on_device_ = inv_freq_.to(positions.device());
    }
    inv = inv_freq_on_device_;
  }
  return RopeCosSin(config_, RopeFrequencies{inv, rope_scaling_}, positions, dtype);
}

torch::Tensor TransformerImpl::ForwardHidden(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                                             const torch::Tensor& attention_mask) {
  auto h = model->embed_tokens(input_ids);
  auto [cos, sin] = Rope(position_ids, h.scalar_type());
  torch::Tensor mask = AttentionMask4d(attention_mask, input_ids.size(1), h.device());
  for (const auto& m : *model->layers) {
    auto* layer = m->as<DecoderLayerImpl>();
    if (checkpoint_blocks_) {
      // (cos and sin are structured bindings, which C++17 lambdas cannot
      // capture by name.)
      auto block = [layer, cos = cos, sin = sin, mask](const torch::Tensor& x) {
        return layer->Forward(x, cos, sin, mask, nullptr);
      };
      h = CheckpointedBlock(block, h);
    } else {
      h = layer->Forward(h, cos, sin, mask, routing_);
    }
  }
  return model->norm(h);
}

torch::Tensor CheckpointedBlock(std::function<torch::Tensor(const torch::Tensor&)> block, const torch::Tensor& h) {
  // A block whose input carries no gradient has nothing to recompute for.
  if (!torch::GradMode::is_enabled() || !h.requires_grad()) return block(h);
  return CheckpointedBlockFunction::apply(c10::make_intrusive<BlockHolder>(std::move(block)), h)[0];
}

int64_t CheckpointedBlockReruns() { return block_reruns.load(std::memory_order_relaxed); }

void TransformerImpl::set_activation_checkpointing(bool on) {
  TORCH_CHECK(!on || config_.NumMoeLayers() == 0, "activation checkpointing: not built for MoE layers");
  checkpoint_blocks_ = on;
}

torch::Tensor TransformerImpl::LmHeadWeight() {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor TransformerImpl::Logits(const torch::Tensor& hidden) {
  return torch::matmul(hidden, LmHeadWeight().t());
}

torch::Tensor TransformerImpl::Forward(const torch::Tensor& input_ids, const torch::Tensor& position_ids) {
  return Logits(ForwardHidden(input_ids, position_ids));
}

torch::Tensor TransformerImpl::ValuesFromHidden(const torch::Tensor& hidden) {
  TORCH_CHECK(score, "Values: the model has no value head (config.value_head=false)");
  return score(hidden).squeeze(-1);
}

torch::Tensor TransformerImpl::Values(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                                      const torch::Tensor& attention_mask) {
  return ValuesFromHidden(ForwardHidden(input_ids, position_ids, attention_mask));
}

torch::Tensor TransformerImpl::Prefill(const torch::Tensor& input_ids, const torch::Tensor& lens, int64_t capacity,
                                       KvCache* cache) {
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  TORCH_CHECK(capacity >= T, "Prefill: capacity ", capacity, " < prompt width ", T);
  auto positions = torch::arange(T, input_ids.options()).unsqueeze(0).expand({B, T});
  auto h = model->embed_tokens(input_ids);
  auto [cos, sin] = Rope(positions, h.scalar_type());
  cache->k.clear();
  cache->v.clear();
  const int64_t kvh = config_.num_kv_heads, d = config_.HeadDim();
  for (const auto& m : *model->layers) {
    auto* layer = m->as<DecoderLayerImpl>();
    torch::Tensor k, v;
    // Right padding: real tokens only ever see earlier real tokens under the
    // causal mask, so no padding mask is needed.
    h = h + layer->self_attn->Full(layer->input_layernorm(h), cos, sin, {}, &k, &v);
    h = h + layer->Ffn(layer->post_attention_layernorm(h), routing_);
    auto kc = torch::zeros({B, kvh, capacity, d}, k.options());
    auto vc = torch::zeros({B, kvh, capacity, d}, v.options());
    kc.narrow(2, 0, T).copy_(k);
    vc.narrow(2, 0, T).copy_(v);
    cache->k.push_back(kc);
    cache->v.push_back(vc);
  }
  auto last = (lens - 1).clamp_min(0);
  auto rows = torch::arange(B, lens.options());
  h = h.index({rows, last});  // [B,H]
  return model->norm(h);
}

torch::Tensor TransformerImpl::DecodeStep(const torch::Tensor& ids, const torch::Tensor& lens, int64_t max_len,
                                          KvCache* cache) {
  const int64_t N = ids.size(0);
  const int64_t used = max_len + 1;
  auto h = model->embed_tokens(ids.view({N, 1}));
  auto [cos, sin] = Rope(lens.view({N, 1}), h.scalar_type());
  // key_mask [N,1,1,used]: position j is visible to row r iff j <= lens[r].
  auto key_mask = torch::arange(used, lens.options()).view({1, used}).le(lens.view({N, 1})).view({N, 1, 1, used});
  int64_t i = 0;
  for (const auto& m : *model->layers) {
    auto* layer = m->as<DecoderLayerImpl>();
    h = h + layer->self_attn->Decode(layer->input_layernorm(h), cos, sin, cache->k[i], cache->v[i], lens, key_mask,
                                     used);
    h = h + layer->Ffn(layer->post_attention_layernorm(h), routing_);
    ++i;
  }
  return model->norm(h).squeeze(1);
}

namespace {
bool IsAdapterName(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}
}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> TransformerImpl::NamedParameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : named_parameters(/*recurse=*/true)) {
    if (!IsAdapterName(p.key())) out.emplace_back(p.key(), p.value());
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> TransformerImpl::AdapterParameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, linear] : AdaptableLinears()) {
    if (!linear->has_adapter()) continue;
    out.emplace_back(name + ".lora_A.weight", linear->lora_A());
    out.emplace_back(name + ".lora_B.weight", linear->lora_B());
  }
  return out;
}

std::vector<std::pair<std::string, LoraLinear>> TransformerImpl::AdaptableLinears() const {
  std::vector<std::pair<std::string, LoraLinear>> out;
  for (size_t i = 0; i < model->layers->size(); ++i) {
    const std::string prefix = "model.layers." + std::to_string(i);
    auto* layer = model->layers->ptr(i)->as<DecoderLayerImpl>();
    const AttentionImpl& a = *layer->self_attn;
    out.emplace_back(prefix + ".self_attn.q_proj", a.q_proj);
    out.emplace_back(prefix + ".self_attn.k_proj", a.k_proj);
    out.emplace_back(prefix + ".self_attn.v_proj", a.v_proj);
    out.emplace_back(prefix + ".self_attn.o_proj", a.o_proj);
    if (layer->mlp) {
      out.emplace_back(prefix + ".mlp.gate_proj", layer->mlp->gate_proj);
      out.emplace_back(prefix + ".mlp.up_proj", layer->mlp->up_proj);
      out.emplace_back(prefix + ".mlp.down_proj", layer->mlp->down_proj);
    }
  }
  return out;
}

void TransformerImpl::SetAdaptersEnabled(bool on) {
  for (auto& [name, linear] : AdaptableLinears()) linear->set_adapter_enabled(on);
}

}  // namespace rlmesh::actor
