#include "actor/logprobs.h"

#include <torch/autograd.h>

#include "absl/strings/str_cat.h"
#include "actor/transformer.h"

namespace rlmesh::actor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Scaled logits of one time chunk in fp32: [B,c,V].
at::Tensor ChunkLogits(const at::Tensor& h, const at::Tensor& w, double inv_temp) {
  return at::matmul(h, w.t()).to(at::kFloat) * inv_temp;
}

// Forward keeps only hidden, weight and targets; backward recomputes logits
// chunk by chunk. d logp_y/ds = onehot(y) - p; dH/ds = -p * (log p + H).
struct ChunkedLogProbs : public torch::autograd::Function<ChunkedLogProbs> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& targets, double inv_temp, int64_t chunk) {
    const int64_t B = hidden.size(0), T = hidden.size(1);
    auto lp = at::zeros({B, T}, hidden.options().dtype(at::kFloat));
    auto ent = at::zeros({B, T}, hidden.options().dtype(at::kFloat));
    {
      at::NoGradGuard no_grad;
      for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        const int64_t c = std::min(chunk, T - t0);
        auto s = ChunkLogits(hidden.narrow(1, t0, c), weight, inv_temp);
        auto logp = at::log_softmax(s, -1);
        auto tgt = targets.narrow(1, t0, c);
        auto valid = tgt.ge(0);
        auto picked = logp.gather(-1, tgt.clamp_min(0).unsqueeze(-1)).squeeze(-1);
        lp.narrow(1, t0, c).copy_(at::where(valid, picked, at::zeros_like(picked)));
        ent.narrow(1, t0, c).copy_(-(logp.exp() * logp).sum(-1));
      }
    }
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["inv_temp"] = inv_temp;
    ctx->saved_data["chunk"] = chunk;
    return {lp, ent};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& hidden = saved[0];
    const auto& weight = saved[1];
    const auto& targets = saved[2];
    const double inv_temp = ctx->saved_data["inv_temp"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t T = hidden.size(1);
    at::Tensor g_lp = grads[0], g_ent = grads[1];
    auto grad_h = at::zeros_like(hidden);
    auto grad_w = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t c = std::min(chunk, T - t0);
      auto h = hidden.narrow(1, t0, c);
      auto s = ChunkLogits(h, weight, inv_temp);
      auto logp = at::log_softmax(s, -1);
      auto p = logp.exp();
      auto grad_s = at::zeros_like(s);
      if (g_lp.defined()) {
        auto tgt = targets.narrow(1, t0, c);
        auto g = g_lp.narrow(1, t0, c).to(at::kFloat) * tgt.ge(0).to(at::kFloat);
        grad_s = -p * g.unsqueeze(-1);
        grad_s.scatter_add_(-1, tgt.clamp_min(0).unsqueeze(-1), g.unsqueeze(-1));
      }
      if (g_ent.defined()) {
        auto H = -(p * logp).sum(-1, /*keepdim=*/true);
        grad_s = grad_s - g_ent.narrow(1, t0, c).to(at::kFloat).unsqueeze(-1) * p * (logp + H);
      }
      auto grad_z = (grad_s * inv_temp).to(hidden.scalar_type());  // [B,c,V]
      grad_h.narrow(1, t0, c).copy_(at::matmul(grad_z, weight));
      auto gz2 = grad_z.reshape({-1, grad_z.size(-1)});
      auto h2 = h.reshape({-1, h.size(-1)});
      grad_w.add_(at::matmul(gz2.t(), h2).to(at::kFloat));
    }
    return {grad_h, grad_w.to(weight.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

absl::Status CheckIds(const at::Tensor& t, const char* name, int64_t B, int64_t T) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(name, ": undefined"));
  if (t.dim() != 2 || t.size(0) != B || t.size(1) != T) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected shape [", B, ", ", T, "], got ", c10::str(t.sizes())));
  }
  if (t.scalar_type() != at::kLong) return absl::InvalidArgumentError(absl::StrCat(name, ": must be int64"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenLogProbsOutput> TokenLogProbsFromHidden(const at::Tensor& hidden, const at::Tensor& weight,
                                                            const at::Tensor& targets, int64_t chunk_size,
                                                            double temperature) {
  if (chunk_size <= 0) return absl::InvalidArgumentError("chunk_size: must be > 0");
  if (!(temperature > 0)) return absl::InvalidArgumentError("temperature: must be > 0");
  if (!hidden.defined() || hidden.dim() != 3) return absl::InvalidArgumentError("hidden: expected [B,T,H]");
  if (!weight.defined() || weight.dim() != 2 || weight.size(1) != hidden.size(2)) {
    return absl::InvalidArgumentError("weight: expected [V,H] matching hidden");
  }
  absl::Status s = CheckIds(targets, "targets", hidden.size(0), hidden.size(1));
  if (!s.ok()) return s;
  try {
    if (targets.numel() > 0 && targets.max().item<int64_t>() >= weight.size(0)) {
      return absl::InvalidArgumentError(absl::StrCat("targets: id >= vocab size ", weight.size(0)));
    }
    auto out = ChunkedLogProbs::apply(hidden, weight, targets, 1.0 / temperature, chunk_size);
    return TokenLogProbsOutput{out[0], out[1]};
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("TokenLogProbs: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<TokenLogProbsOutput> TokenLogProbs(Transformer& model, const at::Tensor& input_ids,
                                                  const at::Tensor& positions, const at::Tensor& targets,
                                                  int64_t chunk_size, double temperature,
                                                  const at::Tensor& attention_mask) {
  if (!input_ids.defined() || input_ids.dim() != 2) return absl::InvalidArgumentError("input_ids: expected [B,T]");
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  absl::Status s = CheckIds(input_ids, "input_ids", B, T);
  if (s.ok()) s = CheckIds(positions, "positions", B, T);
  if (s.ok()) s = CheckIds(targets, "targets", B, T);
  if (!s.ok()) return s;
  try {
    if (input_ids.numel() > 0) {
      int64_t lo = input_ids.min().item<int64_t>(), hi = input_ids.max().item<int64_t>();
      if (lo < 0 || hi >= model->config().vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("input_ids: ids must be in [0, ", model->config().vocab_size,
                                                       "), got [", lo, ", ", hi, "]"));
      }
    }
    auto hidden = model->ForwardHidden(input_ids, positions, attention_mask);
    return TokenLogProbsFromHidden(hidden, model->LmHeadWeight(), targets, chunk_size, temperature);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("TokenLogProbs: ", e.what_without_backtrace()));
  }
}

}  // namespace rlmesh::actor
