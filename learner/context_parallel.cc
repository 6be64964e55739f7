#include "learner/context_parallel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actor/attention_inputs.h"
#include "actor/rope.h"
#include "actor/transformer.h"
#include "common/status_macros.h"
#include "learner/tensor_checks.h"
#include "parallel/tensor_parallel.h"
#include "parallel/token_inputs.h"

namespace rlmesh::learner {

struct ContextParallelModel::Impl {
  // The whole model, or under tensor parallelism the shard of `tp`.
  actor::Transformer model{nullptr};
  actor::RopeFrequencies rope;
  c10::intrusive_ptr<c10d::Backend> group;  // null for one rank
  int rank = 0, size = 1;
  KeyValueExchange exchange = KeyValueExchange::kRing;
  int64_t logprob_chunk = 128;
  // The whole model's vocabulary (the shard holds 1 / tp of it).
  int64_t vocab_size = 0;
  // Tensor parallelism: the model whose shard runs, its group (null
  // without) and this rank's place in it.
  parallel::TensorParallelModel* tp = nullptr;
  c10d::Backend* tp_group = nullptr;
  int tp_rank = 0;
};

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One ring round: sends `t` to rank + 1 and returns what rank - 1 sent.
at::Tensor RingStep(c10d::Backend* group, int size, int rank, const at::Tensor& t) {
  std::vector<at::Tensor> out{t}, in{at::empty_like(t)};
  auto sent = group->send(out, (rank + 1) % size, 0);
  group->recv(in, (rank + size - 1) % size, 0)->wait();
  sent->wait();
  return in[0];
}

// Every rank's [B, kv, 2c, D] keys (or values) laid out in sequence order,
// [B, kv, 2C c, D]: rank r's first half is chunk r, its second chunk
// 2C - 1 - r. By ring, C - 1 rounds each passing on what came from rank - 1
// the round before; or by c10d's all-gather.
at::Tensor GatherSequence(const ContextParallelModel::Impl& im, const at::Tensor& local) {
  const int size = im.size, rank = im.rank;
  if (size == 1) return local;
  std::vector<at::Tensor> shares(size);
  shares[rank] = local.contiguous();
  if (im.exchange == KeyValueExchange::kRing) {
    for (int i = 0; i < size - 1; ++i) {
      const int from = (rank + size - 1 - i) % size, held = (from + 1) % size;
      shares[from] = RingStep(im.group.get(), size, rank, shares[held]);
    }
  } else {
    std::vector<at::Tensor> in{shares[rank]};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < size; ++r) out[0].push_back(at::empty_like(in[0]));
    im.group->allgather(out, in)->wait();
    shares = out[0];
  }
  const int64_t c = local.size(2) / 2;
  std::vector<at::Tensor> chunks(2 * size);
  for (int r = 0; r < size; ++r) {
    chunks[r] = shares[r].narrow(2, 0, c);
    chunks[2 * size - 1 - r] = shares[r].narrow(2, c, c);
  }
  return at::cat(chunks, 2);
}

// Rank r's share of a whole-sequence tensor laid out as GatherSequence
// returns it: chunks r and 2C - 1 - r.
at::Tensor Share(const at::Tensor& whole, int size, int r) {
  const int64_t c = whole.size(2) / (2 * size);
  return at::cat({whole.narrow(2, r * c, c), whole.narrow(2, (2 * size - 1 - r) * c, c)}, 2);
}

// This rank's share of a whole-sequence tensor laid out as GatherSequence
// returns it, summed over the group. By ring (a reduce-scatter: round i
// passes on the partial sum of rank (rank - i - 1)'s share, adding this
// rank's part of the next), or by c10d's all-reduce of the whole.
at::Tensor ReduceToLocal(const ContextParallelModel::Impl& im, at::Tensor whole) {
  const int size = im.size, rank = im.rank;
  if (size == 1) return Share(whole, size, rank);
  if (im.exchange == KeyValueExchange::kRing) {
    at::Tensor partial = Share(whole, size, (rank + size - 1) % size).contiguous();
    for (int i = 0; i < size - 1; ++i) {
      partial = RingStep(im.group.get(), size, rank, partial) + Share(whole, size, (rank + 2 * size - 2 - i) % size);
    }
    return partial;
  }
  std::vector<at::Tensor> t{whole};
  im.group->allreduce(t)->wait();
  return Share(whole, size, rank);
}

// Key/value heads repeated for grouped queries, [B, kv, T, D] ->
// [B, kv * g, T, D] (query head h reads key head h / g, as SDPA's
// enable_gqa does), and the gradient's sum back.
at::Tensor ExpandHeads(const at::Tensor& x, int64_t g) { return g == 1 ? x : x.repeat_interleave(g, 1); }
at::Tensor SumHeads(const at::Tensor& x, int64_t g) {
  if (g == 1) return x;
  return x.view({x.size(0), x.size(1) / g, g, x.size(2), x.size(3)}).sum(2);
}

// The blocks query chunk `g` (of length c) attends over: the chunks before
// it, without a mask, and its own, causally. Each as (begin, length,
// causal) on the key axis.
std::vector<std::tuple<int64_t, int64_t, bool>> Blocks(int64_t g, int64_t c) {
  std::vector<std::tuple<int64_t, int64_t, bool>> out;
  if (g > 0) out.emplace_back(0, g * c, false);
  out.emplace_back(g * c, c, true);
  return out;
}

// Keys per block under an attention mask: the block's additive mask is
// [B, 1, c, kMaskedKeys] floats.
constexpr int64_t kMaskedKeys = 256;

// Under an attention mask, the key blocks query chunk `g` (of length c)
// attends over: [0, (g + 1) c) in pieces of kMaskedKeys, each with its
// [B, 1, c, len] mask (actor::AttentionMaskBlock's rule, causal included;
// `mask` is the padded [B, T] attention mask). Blocks no query of the chunk
// sees (a packed row's other documents) are left out.
std::vector<std::tuple<int64_t, int64_t, at::Tensor>> MaskedBlocks(const at::Tensor& mask, int64_t g, int64_t c) {
  const at::Tensor queries = at::arange(g * c, (g + 1) * c, at::kLong);
  std::vector<std::tuple<int64_t, int64_t, at::Tensor>> out;
  for (int64_t begin = 0; begin < (g + 1) * c; begin += kMaskedKeys) {
    const int64_t len = std::min(kMaskedKeys, (g + 1) * c - begin);
    at::Tensor seen = actor::AttentionMaskBlock(mask, queries, at::arange(begin, begin + len, at::kLong));
    if (seen.any().item<bool>()) out.emplace_back(begin, len, std::move(seen));
  }
  return out;
}

// The flash kernel's form of a block's mask: 0 where `seen`, -inf elsewhere,
// in the queries' dtype.
at::Tensor Additive(const at::Tensor& seen, const at::Tensor& q) {
  return at::zeros(seen.sizes(), q.options()).masked_fill_(seen.logical_not(), -INFINITY);
}

// Masked attention of qc [B, H, c, D] over kb, vb [B, H, len, D] where
// `seen` [B, 1, c, len] allows, by the flash kernel: the output and the
// log-sum-exp, -inf (with a zero output) for a query that sees no key of
// the block (the kernel gives 0 there, which would weigh it as e^0).
std::pair<at::Tensor, at::Tensor> MaskedBlock(const at::Tensor& qc, const at::Tensor& kb, const at::Tensor& vb,
                                              const at::Tensor& seen, double scale) {
  auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(qc, kb.contiguous(), vb.contiguous(), 0.0, false,
                                                                  Additive(seen, qc), scale);
  return {o, lse.masked_fill(seen.any(-1).logical_not(), -INFINITY)};
}

// The gradients (dq, dk, dv) of MaskedBlock's share of a query's attention,
// from the whole row's output `o` and log-sum-exp `lse` (the block's
// probabilities are its share of the row's softmax; a query that sees no
// key of the block gets none).
std::tuple<at::Tensor, at::Tensor, at::Tensor> MaskedBlockBackward(const at::Tensor& dout, const at::Tensor& qc,
                                                                   const at::Tensor& kb, const at::Tensor& vb,
                                                                   const at::Tensor& o, const at::Tensor& lse,
                                                                   const at::Tensor& seen, double scale) {
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(dout.contiguous(), qc.contiguous(),
                                                                  kb.contiguous(), vb.contiguous(), o.contiguous(),
                                                                  lse.contiguous(), 0.0, false, Additive(seen, qc),
                                                                  scale);
}

// One query chunk's attention over key blocks, merged by the blocks'
// log-sum-exps.
struct MergedAttention {
  at::Tensor o, lse;
  void Add(const at::Tensor& ob, const at::Tensor& lb) {
    if (!o.defined()) {
      o = ob;
      lse = lb;
      return;
    }
    // Two softmaxes over disjoint keys, merged by their normalisers; a
    // query that has seen no key yet (-inf in both) weighs nothing.
    const at::Tensor merged = at::logaddexp(lse, lb);
    const at::Tensor norm = merged.masked_fill(merged.isinf(), 0);
    o = (lse - norm).exp().unsqueeze(-1) * o + (lb - norm).exp().unsqueeze(-1) * ob;
    lse = merged;
  }
};

// Causal attention of this rank's queries over every rank's keys and
// values. q [B, H, 2c, D]; k, v [B, kv, 2c, D], all after RoPE. `mask`:
// the padded [B, 2Cc] attention mask, or none (plain causal).
struct AttentionFunction : public torch::autograd::Function<AttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, int64_t impl, double scale, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask) {
    auto* im = reinterpret_cast<ContextParallelModel::Impl*>(impl);
    const int64_t g = q.size(1) / k.size(1), c = q.size(2) / 2;
    const at::Tensor K = ExpandHeads(GatherSequence(*im, k), g);
    const at::Tensor V = ExpandHeads(GatherSequence(*im, v), g);
    std::vector<at::Tensor> outs, lses;
    for (int half = 0; half < 2; ++half) {
      const int64_t chunk = half == 0 ? im->rank : 2 * im->size - 1 - im->rank;
      const at::Tensor qc = q.narrow(2, half * c, c);
      MergedAttention merged;
      if (mask) {
        for (const auto& [begin, len, seen] : MaskedBlocks(*mask, chunk, c)) {
          auto [ob, lb] = MaskedBlock(qc, K.narrow(2, begin, len), V.narrow(2, begin, len), seen, scale);
          merged.Add(ob, lb);
        }
      } else {
        for (const auto& [begin, len, causal] : Blocks(chunk, c)) {
          auto [ob, lb] = at::_scaled_dot_product_flash_attention_for_cpu(qc, K.narrow(2, begin, len),
                                                                          V.narrow(2, begin, len), 0.0, causal,
                                                                          std::nullopt, scale);
          merged.Add(ob, lb);
        }
      }
      outs.push_back(merged.o.contiguous());
      lses.push_back(merged.lse.contiguous());
    }
    at::Tensor out = at::cat(outs, 2), lse = at::cat(lses, 2);
    ctx->saved_data["impl"] = impl;
    ctx->saved_data["scale"] = scale;
    if (mask) ctx->saved_data["mask"] = *mask;
    ctx->save_for_backward({q, k, v, out, lse});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto* im = reinterpret_cast<ContextParallelModel::Impl*>(ctx->saved_data["impl"].toInt());
    const double scale = ctx->saved_data["scale"].toDouble();
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto mask = ctx->saved_data.find("mask");
    const int64_t g = q.size(1) / k.size(1), c = q.size(2) / 2;
    const at::Tensor K = ExpandHeads(GatherSequence(*im, k), g);
    const at::Tensor V = ExpandHeads(GatherSequence(*im, v), g);
    const at::Tensor dout = grad_out[0].contiguous();
    at::Tensor dK = at::zeros_like(K), dV = at::zeros_like(V);
    std::vector<at::Tensor> dqs;
    for (int half = 0; half < 2; ++half) {
      const int64_t chunk = half == 0 ? im->rank : 2 * im->size - 1 - im->rank;
      const at::Tensor qc = q.narrow(2, half * c, c), oc = out.narrow(2, half * c, c);
      const at::Tensor lc = lse.narrow(2, half * c, c), dc = dout.narrow(2, half * c, c);
      at::Tensor dq = at::zeros_like(qc);
      // The whole row's output and normaliser: the block's share of the
      // softmax, so its gradients are exact.
      auto add = [&](int64_t begin, int64_t len, const at::Tensor& dqb, const at::Tensor& dkb, const at::Tensor& dvb) {
        dq = dq + dqb;
        dK.narrow(2, begin, len).add_(dkb);
        dV.narrow(2, begin, len).add_(dvb);
      };
      if (mask != ctx->saved_data.end()) {
        for (const auto& [begin, len, seen] : MaskedBlocks(mask->second.toTensor(), chunk, c)) {
          auto [dqb, dkb, dvb] = MaskedBlockBackward(dc, qc, K.narrow(2, begin, len), V.narrow(2, begin, len), oc,
                                                     lc, seen, scale);
          add(begin, len, dqb, dkb, dvb);
        }
      } else {
        for (const auto& [begin, len, causal] : Blocks(chunk, c)) {
          auto [dqb, dkb, dvb] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
              dc.contiguous(), qc.contiguous(), K.narrow(2, begin, len).contiguous(),
              V.narrow(2, begin, len).contiguous(), oc.contiguous(), lc.contiguous(), 0.0, causal, std::nullopt,
              scale);
          add(begin, len, dqb, dkb, dvb);
        }
      }
      dqs.push_back(dq);
    }
    at::Tensor dk = ReduceToLocal(*im, SumHeads(dK, g).contiguous());
    at::Tensor dv = ReduceToLocal(*im, SumHeads(dV, g).contiguous());
    return {at::Tensor(), at::Tensor(), at::cat(dqs, 2), dk, dv, at::Tensor()};
  }
};

// One decoder layer on this rank's tokens h [B, 2c, H]; under tensor
// parallelism with the shard's heads and channels, entering and leaving
// each block as parallel/tensor_parallel.h's layer does.
at::Tensor Layer(ContextParallelModel::Impl& im, actor::DecoderLayerImpl& layer, const at::Tensor& h,
                 const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask) {
  const actor::ModelConfig& c = im.model->config();
  const int64_t B = h.size(0), T = h.size(1), D = c.HeadDim();
  actor::AttentionImpl& a = *layer.self_attn;
  const at::Tensor x = parallel::CopyToTensorParallel(layer.input_layernorm(h), im.tp_group);
  const at::Tensor q = a.Queries(x, cos, sin).transpose(1, 2);
  const at::Tensor k = a.Keys(x, cos, sin).transpose(1, 2);
  const at::Tensor v = a.v_proj(x).view({B, T, c.num_kv_heads, D}).transpose(1, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const at::Tensor o = AttentionFunction::apply(reinterpret_cast<int64_t>(&im), scale, q, k, v,
                                                mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt);
  const at::Tensor y =
      h + parallel::ReduceFromTensorParallel(a.o_proj(o.transpose(1, 2).reshape({B, T, c.num_heads * D})),
                                             im.tp_group);
  return y + parallel::ReduceFromTensorParallel(
                 layer.mlp(parallel::CopyToTensorParallel(layer.post_attention_layernorm(y), im.tp_group)),
                 im.tp_group);
}

}  // namespace

std::vector<int64_t> ZigZagPositions(int64_t T, int rank, int ranks) {
  const int64_t chunks = 2 * static_cast<int64_t>(ranks);
  const int64_t c = (T + chunks - 1) / chunks;
  std::vector<int64_t> out;
  for (int64_t chunk : {static_cast<int64_t>(rank), chunks - 1 - rank}) {
    for (int64_t t = 0; t < c; ++t) out.push_back(chunk * c + t);
  }
  return out;
}

at::Tensor ZigZagMask(int64_t rows, int64_t T, int rank, int ranks) {
  std::vector<int64_t> mine;
  for (int64_t t : ZigZagPositions(T, rank, ranks)) {
    if (t < T) mine.push_back(t);
  }
  return at::zeros({rows, T}, at::kFloat).index_fill(1, at::tensor(mine, at::kLong), 1.0);
}

absl::Status ValidateContextParallel(const actor::ModelConfig& config) {
  if (config.NumMoeLayers() > 0) {
    return absl::UnimplementedError("learner.cp: context parallelism is not built for MoE models");
  }
  if (config.value_head) {
    return absl::UnimplementedError(
        "learner.cp: context parallelism is not built for value-head models (reward models, critics)");
  }
  return absl::OkStatus();
}

ContextParallelModel::~ContextParallelModel() = default;

absl::StatusOr<std::unique_ptr<ContextParallelModel>> ContextParallelModel::Create(
    const actor::ModelConfig& config, c10::intrusive_ptr<c10d::Backend> group, int64_t logprob_chunk) {
  RLMESH_RETURN_IF_ERROR(ValidateContextParallel(config));
  try {
    return Wrap(actor::Transformer(config), std::move(group), logprob_chunk);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("context-parallel model: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<ContextParallelModel>> ContextParallelModel::Wrap(
    const actor::Transformer& model, c10::intrusive_ptr<c10d::Backend> group, int64_t logprob_chunk) {
  RLMESH_RETURN_IF_ERROR(ValidateContextParallel(model->config()));
  if (logprob_chunk <= 0) return absl::InvalidArgumentError("logprob_chunk: must be > 0");
  std::unique_ptr<ContextParallelModel> m(new ContextParallelModel());
  m->impl_ = std::make_unique<Impl>();
  Impl& im = *m->impl_;
  im.model = model;
  try {
    im.rope = actor::ComputeRope(model->config());
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("context-parallel model: ", e.what()));
  }
  im.size = group ? group->getSize() : 1;
  im.rank = group ? group->getRank() : 0;
  im.group = im.size > 1 ? group : nullptr;
  im.logprob_chunk = logprob_chunk;
  im.vocab_size = model->config().vocab_size;
  m->rank_ = im.rank;
  m->size_ = im.size;
  return m;
}

absl::StatusOr<std::unique_ptr<ContextParallelModel>> ContextParallelModel::WrapTensorParallel(
    parallel::TensorParallelModel& tp, c10::intrusive_ptr<c10d::Backend> group, int64_t logprob_chunk) {
  RLMESH_RETURN_IF_ERROR(ValidateContextParallel(tp.config()));
  if (tp.options().sequence_parallel) {
    return absl::UnimplementedError("learner.sequence_parallel: with learner.cp > 1 is not built");
  }
  RLMESH_ASSIGN_OR_RETURN(std::unique_ptr<ContextParallelModel> m, Wrap(tp.shard(), std::move(group), logprob_chunk));
  Impl& im = *m->impl_;
  im.vocab_size = tp.config().vocab_size;
  im.tp = &tp;
  im.tp_group = tp.group();
  im.tp_rank = tp.rank();
  // Wrap's RoPE tables from the shard's config are the whole model's: the
  // shard keeps the head dimension, theta and scaling.
  return m;
}

absl::Status ContextParallelModel::LoadFromFull(const Named& full) {
  if (impl_->tp != nullptr) return impl_->tp->LoadFromFull(full);
  const std::map<std::string, at::Tensor> by_name(full.begin(), full.end());
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : impl_->model->NamedParameters()) {
    RLMESH_RETURN_IF_ERROR(internal::CopyNamed(by_name, name, p));
  }
  return absl::OkStatus();
}

void ContextParallelModel::set_key_value_exchange(KeyValueExchange exchange) { impl_->exchange = exchange; }

ContextParallelModel::Named ContextParallelModel::NamedParameters() const { return impl_->model->NamedParameters(); }

std::vector<at::Tensor> ContextParallelModel::Parameters() const {
  // Under tensor parallelism in the order of its NormWeights.
  return impl_->tp != nullptr ? impl_->tp->TrainedParameters() : impl_->model->parameters();
}

absl::StatusOr<ContextParallelOutput> ContextParallelModel::TokenLogProbs(const at::Tensor& ids,
                                                                        const at::Tensor& positions,
                                                                        const at::Tensor& targets,
                                                                        double temperature,
                                                                        const at::Tensor& attention_mask) {
  Impl& im = *impl_;
  const actor::ModelConfig& c = im.model->config();
  RLMESH_RETURN_IF_ERROR(parallel::ValidateTokenInputs(ids, positions, targets, temperature, im.vocab_size));
  if (attention_mask.defined() && attention_mask.sizes() != ids.sizes()) {
    return absl::InvalidArgumentError("attention_mask: must be [rows, T] like input_ids");
  }
  try {
    const int64_t B = ids.size(0), T = ids.size(1);
    const std::vector<int64_t> mine = ZigZagPositions(T, im.rank, im.size);
    const int64_t padded = static_cast<int64_t>(mine.size()) * im.size;
    // Padding past T: token 0 at the next positions, no target.
    auto pad = [&](const at::Tensor& x, int64_t value) {
      if (padded == T) return x;
      return at::cat({x, at::full({B, padded - T}, value, x.options())}, 1);
    };
    const at::Tensor pos_padded =
        padded == T ? positions
                    : at::cat({positions, positions.narrow(1, T - 1, 1) + at::arange(1, padded - T + 1, positions.options())},
                              1);
    const at::Tensor index = at::tensor(mine, at::kLong);
    const at::Tensor my_ids = pad(ids, 0).index_select(1, index);
    const at::Tensor my_pos = pos_padded.index_select(1, index);
    const at::Tensor my_targets = pad(targets, -1).index_select(1, index);
    // The whole (padded) row's mask: every rank builds its blocks' masks
    // from it. The padding is its own (padding) segment.
    const at::Tensor mask = attention_mask.defined() ? pad(attention_mask, 0) : at::Tensor();
    at::Tensor h = im.tp_group == nullptr ? im.model->model->embed_tokens(my_ids)
                                          : parallel::ReduceFromTensorParallel(
                                                parallel::VocabParallelLookup(*im.model, my_ids, im.tp_rank),
                                                im.tp_group);
    auto [cos, sin] = actor::RopeCosSin(c, im.rope, my_pos, h.scalar_type());
    // Checkpointed, a layer keeps only its input; its backward runs the
    // layer again, exchanges included, on every rank in the same order.
    // The option is the tensor-parallel model's under TP, else the whole
    // model's own.
    const bool checkpoint =
        im.tp != nullptr ? im.tp->options().activation_checkpointing : im.model->activation_checkpointing();
    for (const auto& layer : *im.model->model->layers) {
      actor::DecoderLayerImpl* l = layer->as<actor::DecoderLayerImpl>();
      auto run = [&im, l, cos = cos, sin = sin, mask](const at::Tensor& x) { return Layer(im, *l, x, cos, sin, mask); };
      h = checkpoint ? actor::CheckpointedBlock(run, h) : run(h);
    }
    actor::TokenLogProbsOutput local;
    if (im.tp_group == nullptr) {
      RLMESH_ASSIGN_OR_RETURN(local, actor::TokenLogProbsFromHidden(im.model->model->norm(h),
                                                                    im.model->LmHeadWeight(), my_targets,
                                                                    im.logprob_chunk, temperature));
    } else {
      // The vocabulary-parallel log-softmax: no rank forms the whole logits.
      local = parallel::VocabParallelLogProbs(
          parallel::CopyToTensorParallel(im.model->model->norm(h), im.tp_group), im.model->LmHeadWeight(),
          my_targets, temperature, im.tp_group);
    }
    // Back to [B, T]: the rank's positions inside T carry its values.
    std::vector<int64_t> keep, at_t;
    for (size_t i = 0; i < mine.size(); ++i) {
      if (mine[i] < T) {
        keep.push_back(static_cast<int64_t>(i));
        at_t.push_back(mine[i]);
      }
    }
    const at::Tensor keep_i = at::tensor(keep, at::kLong), at_i = at::tensor(at_t, at::kLong);
    auto place = [&](const at::Tensor& x) {
      return at::zeros({B, T}, x.options()).index_copy(1, at_i, x.index_select(1, keep_i));
    };
    ContextParallelOutput out;
    out.out = {place(local.logprobs), place(local.entropy)};
    out.mine = ZigZagMask(B, T, im.rank, im.size);
    return out;
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat("context-parallel log-probs failed: ", e.what()));
  }
}

}  // namespace rlmesh::learner
