#include "parallel/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actor/attention_inputs.h"
#include "common/status_macros.h"
#include "dist/collective.h"
#include "parallel/token_inputs.h"

namespace rlmesh::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group travels through autograd's saved data as an integer: the
// TensorParallelModel that owns it outlives every graph it builds.
int64_t GroupKey(c10d::Backend* g) { return reinterpret_cast<int64_t>(g); }
c10d::Backend* GroupOf(AutogradContext* ctx) {
  return reinterpret_cast<c10d::Backend*>(ctx->saved_data["group"].toInt());
}

at::Tensor AllReduced(c10d::Backend* g, const at::Tensor& x, c10d::ReduceOp op = c10d::ReduceOp::SUM) {
  std::vector<at::Tensor> v = {x.contiguous().clone()};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  g->allreduce(v, opts)->wait();
  return v[0];
}

// [N, ...] -> [size * N, ...]: every rank's rows, in rank order.
at::Tensor AllGathered(c10d::Backend* g, const at::Tensor& x) {
  auto in = x.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] *= g->getSize();
  at::Tensor out = at::empty(shape, in.options());
  g->_allgather_base(out, in)->wait();
  return out;
}

// [size * N, ...] -> [N, ...]: this rank's rows of the sum over ranks.
at::Tensor ReduceScattered(c10d::Backend* g, const at::Tensor& x) {
  auto in = x.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] /= g->getSize();
  at::Tensor out = at::empty(shape, in.options());
  g->_reduce_scatter_base(out, in)->wait();
  return out;
}

at::Tensor Unchanged(c10d::Backend*, const at::Tensor& x) { return x; }
at::Tensor Summed(c10d::Backend* g, const at::Tensor& x) { return AllReduced(g, x); }

using GroupFn = at::Tensor (*)(c10d::Backend*, const at::Tensor&);

// A collective with its conjugate as the gradient: Forward(x) forward,
// Backward(grad) backward, both over the group passed as GroupKey.
template <GroupFn Forward, GroupFn Backward>
struct Conjugate : public torch::autograd::Function<Conjugate<Forward, Backward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return Forward(reinterpret_cast<c10d::Backend*>(group), x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {Backward(GroupOf(ctx), g[0]), at::Tensor()};
  }
};

// Megatron's "f": identity forward, gradient summed over the group. Enters
// a column-parallel region from a replicated activation.
using CopyToShards = Conjugate<Unchanged, Summed>;
// Megatron's "g": sum over the group forward, identity backward. Leaves a
// row-parallel region (partial products) into a replicated activation.
using ReduceFromShards = Conjugate<Summed, Unchanged>;
// Sequence parallelism's entry to a block: all-gather of the rows forward,
// reduce-scatter of the gradient backward.
using GatherRows = Conjugate<AllGathered, ReduceScattered>;
// Sequence parallelism's exit from a block: reduce-scatter forward,
// all-gather backward.
using ScatterRows = Conjugate<ReduceScattered, AllGathered>;

// [size * N, ...] -> [N, ...]: this rank's rows.
at::Tensor OwnRows(c10d::Backend* g, const at::Tensor& x) { return x.chunk(g->getSize())[g->getRank()]; }
// Every rank's rows of a quantity each rank computed whole for its own rows
// (sequence parallelism's values): all-gather forward, this rank's rows of
// the gradient backward.
using GatherOwnRows = Conjugate<AllGathered, OwnRows>;

bool EndsWithAny(const std::string& name, std::initializer_list<const char*> suffixes) {
  for (const char* s : suffixes) {
    if (absl::EndsWith(name, s)) return true;
  }
  return false;
}

at::Tensor Slice(const at::Tensor& full, int dim, int rank, int size) {
  const int64_t n = full.size(dim) / size;
  return full.narrow(dim, rank * n, n);
}

}  // namespace

// Qwen3's q/k norms: each rank applies them to its own heads; under sequence
// parallelism each rank normalises and scores its own rows.
bool TensorParallelGradientIsPartial(const std::string& name, bool sequence_parallel) {
  if (EndsWithAny(name, {"q_norm.weight", "k_norm.weight"})) return true;
  return sequence_parallel && (absl::StrContains(name, "norm.weight") || name == "score.weight");
}

at::Tensor CopyToTensorParallel(const at::Tensor& x, c10d::Backend* group) {
  return group != nullptr && group->getSize() > 1 ? CopyToShards::apply(x, GroupKey(group)) : x;
}

at::Tensor ReduceFromTensorParallel(const at::Tensor& x, c10d::Backend* group) {
  return group != nullptr && group->getSize() > 1 ? ReduceFromShards::apply(x, GroupKey(group)) : x;
}

at::Tensor VocabParallelLookup(actor::TransformerImpl& shard, const at::Tensor& ids, int rank) {
  auto& embed = shard.model->embed_tokens;
  const int64_t v_local = embed->weight.size(0), v_begin = rank * v_local;
  auto in_range = ids.ge(v_begin).logical_and(ids.lt(v_begin + v_local));
  auto local_ids = at::where(in_range, ids - v_begin, at::zeros_like(ids));
  return embed(local_ids) * in_range.unsqueeze(-1).to(embed->weight.dtype());
}

at::Tensor TensorParallelLayer(actor::DecoderLayerImpl& layer, const at::Tensor& h, const at::Tensor& cos,
                               const at::Tensor& sin, const at::Tensor& mask, c10d::Backend* group) {
  auto attn = layer.self_attn->Full(CopyToTensorParallel(layer.input_layernorm(h), group), cos, sin, mask, nullptr,
                                    nullptr);
  at::Tensor out = h + ReduceFromTensorParallel(attn, group);
  return out + ReduceFromTensorParallel(layer.mlp(CopyToTensorParallel(layer.post_attention_layernorm(out), group)),
                                        group);
}

actor::TokenLogProbsOutput VocabParallelLogProbs(const at::Tensor& hidden, const at::Tensor& lm_head,
                                                 const at::Tensor& targets, double temperature,
                                                 c10d::Backend* group) {
  const bool tp = group != nullptr && group->getSize() > 1;
  // This rank's slice of the scaled logits, fp32 [B,T,V/tp].
  at::Tensor z = at::matmul(hidden, lm_head.t()).to(at::kFloat) * (1.0 / temperature);
  // The max only shifts the exponentials: a constant for the gradient.
  at::Tensor m = std::get<0>(z.detach().max(-1, /*keepdim=*/true));
  if (tp) m = AllReduced(group, m, c10d::ReduceOp::MAX);
  at::Tensor e = (z - m).exp();
  at::Tensor sum_e = e.sum(-1, /*keepdim=*/true);
  at::Tensor sum_ez = (e * z).sum(-1, /*keepdim=*/true);
  const int64_t v_local = lm_head.size(0), v_begin = (tp ? group->getRank() : 0) * v_local;
  auto mine = targets.ge(v_begin).logical_and(targets.lt(v_begin + v_local));
  auto local_t = at::where(mine, targets - v_begin, at::zeros_like(targets));
  at::Tensor picked = z.gather(-1, local_t.unsqueeze(-1)) * mine.unsqueeze(-1).to(at::kFloat);
  sum_e = ReduceFromTensorParallel(sum_e, group);
  sum_ez = ReduceFromTensorParallel(sum_ez, group);
  picked = ReduceFromTensorParallel(picked, group);
  at::Tensor log_z = m + sum_e.log();
  at::Tensor lp = (picked - log_z).squeeze(-1);
  lp = at::where(targets.ge(0), lp, at::zeros_like(lp));
  // H = log Z - E_p[z].
  at::Tensor entropy = (log_z - sum_ez / sum_e).squeeze(-1);
  return {lp, entropy};
}

int TensorParallelSplitDim(const std::string& name) {
  if (EndsWithAny(name, {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias",
                         "v_proj.bias", "gate_proj.weight", "up_proj.weight", "embed_tokens.weight",
                         "lm_head.weight"})) {
    return 0;
  }
  if (EndsWithAny(name, {"o_proj.weight", "down_proj.weight"})) return 1;
  return -1;
}

absl::StatusOr<at::Tensor> TensorParallelPiece(const std::string& name, const at::Tensor& held, int slice,
                                               int slices, int piece, int pieces) {
  if (slices < 1 || pieces < 1 || pieces % slices != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pieces: ", pieces, " is not a multiple of the ", slices, " slices held"));
  }
  const int per_slice = pieces / slices;
  if (slice < 0 || slice >= slices || piece < slice * per_slice || piece >= (slice + 1) * per_slice) {
    return absl::InvalidArgumentError(absl::StrCat("piece: ", piece, " of ", pieces, " is not inside slice ", slice,
                                                   " of ", slices));
  }
  const int dim = TensorParallelSplitDim(name);
  if (dim < 0) return held;
  if (!held.defined() || held.dim() <= dim || held.size(dim) % per_slice != 0) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", name, ": dimension ", dim, " of shape ",
                                                   held.defined() ? c10::str(held.sizes()) : "none",
                                                   " does not split into ", per_slice, " pieces"));
  }
  return Slice(held, dim, piece - slice * per_slice, per_slice);
}

at::Tensor JoinTensorParallelPieces(const std::string& name, const std::vector<at::Tensor>& pieces) {
  const int dim = TensorParallelSplitDim(name);
  if (dim < 0 || pieces.size() == 1) return pieces.front();
  return at::cat(pieces, dim);
}

absl::Status ValidateTensorParallel(const actor::ModelConfig& c, int tp) {
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("tp: must be >= 1, got ", tp));
  RLMESH_RETURN_IF_ERROR(c.Validate());
  auto divides = [&](const char* field, int64_t value) -> absl::Status {
    if (value % tp == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("model.", field, " (", value, ") is not divisible by tp (", tp, ")"));
  };
  if (c.IsMoeArch()) {
    return absl::UnimplementedError(absl::StrCat("model.arch ", c.arch,
                                                 ": tensor parallelism of MoE layers is not built (expert "
                                                 "parallelism is a separate layout)"));
  }
  if (c.num_kv_heads < tp) {
    return absl::UnimplementedError(absl::StrCat(
        "model.num_kv_heads (", c.num_kv_heads, ") < tp (", tp,
        "): replicating key/value heads over ranks is not built; use tp <= num_kv_heads"));
  }
  RLMESH_RETURN_IF_ERROR(divides("num_heads", c.num_heads));
  RLMESH_RETURN_IF_ERROR(divides("num_kv_heads", c.num_kv_heads));
  RLMESH_RETURN_IF_ERROR(divides("intermediate_size", c.intermediate_size));
  RLMESH_RETURN_IF_ERROR(divides("vocab_size", c.vocab_size));
  if (c.HasOBias()) {
    return absl::UnimplementedError("model.qkv_bias (attention_bias) with an o_proj bias: a row-parallel bias "
                                    "under tensor parallelism is not built");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TensorParallelModel>> TensorParallelModel::Create(
    const actor::ModelConfig& config, c10::intrusive_ptr<c10d::Backend> group,
    const TensorParallelOptions& options) {
  const int size = group ? group->getSize() : 1;
  RLMESH_RETURN_IF_ERROR(ValidateTensorParallel(config, size));
  std::unique_ptr<TensorParallelModel> m(new TensorParallelModel());
  m->config_ = config;
  m->options_ = options;
  m->group_ = group;
  m->size_ = size;
  m->rank_ = group ? group->getRank() : 0;
  m->shard_config_ = TensorParallelShardConfig(config, size);
  try {
    m->shard_ = actor::Transformer(m->shard_config_);
    m->rope_ = actor::ComputeRope(config);
    if (size > 1) {
      const int64_t key = GroupKey(group.get());
      for (auto& [name, p] : m->shard_->NamedParameters()) {
        if (!TensorParallelGradientIsPartial(name, options.sequence_parallel)) continue;
        p.register_hook([key](const at::Tensor& g) {
          return AllReduced(reinterpret_cast<c10d::Backend*>(key), g);
        });
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("tensor-parallel model: ", e.what_without_backtrace()));
  }
  return m;
}

bool TensorParallelModel::Trained(const std::string& name) const {
  return !(config_.value_head && name == "lm_head.weight");
}

absl::StatusOr<std::vector<at::Tensor>> TensorParallelModel::SliceOf(
    const std::vector<std::pair<std::string, at::Tensor>>& full, bool trained_only) const {
  std::map<std::string, at::Tensor> by_name(full.begin(), full.end());
  std::vector<at::Tensor> out;
  for (auto& [name, p] : shard_->NamedParameters()) {
    if (trained_only && !Trained(name)) continue;
    auto it = by_name.find(name);
    if (it == by_name.end()) return absl::InvalidArgumentError(absl::StrCat("parameter ", name, ": missing"));
    const int dim = TensorParallelSplitDim(name);
    const at::Tensor& src = it->second;
    std::vector<int64_t> want = p.sizes().vec();
    if (dim >= 0) want[dim] *= size_;
    if (!src.defined() || src.sizes().vec() != want) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name, ": expected shape ", c10::str(want),
                                                     ", got ", src.defined() ? c10::str(src.sizes()) : "none"));
    }
    out.push_back(dim >= 0 ? Slice(src, dim, rank_, size_) : src);
  }
  return out;
}

absl::Status TensorParallelModel::LoadFromFull(const std::vector<std::pair<std::string, at::Tensor>>& full) {
  RLMESH_ASSIGN_OR_RETURN(std::vector<at::Tensor> slices, SliceOf(full));
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params = Parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(slices[i]);
  return absl::OkStatus();
}

absl::Status TensorParallelModel::LoadSlices(const std::vector<std::pair<std::string, at::Tensor>>& slices) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : slices) {
    if (!by_name.emplace(name, &t).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name, ": given twice"));
    }
  }
  const auto params = shard_->NamedParameters();
  std::vector<const at::Tensor*> sources;  // in params' order
  for (const auto& [name, p] : params) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return absl::InvalidArgumentError(absl::StrCat("parameter ", name, ": missing"));
    if (!it->second->defined() || it->second->sizes() != p.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", name, ": expected the slice shape ", c10::str(p.sizes()), ", got ",
          it->second->defined() ? c10::str(it->second->sizes()) : "none"));
    }
    sources.push_back(it->second);
    by_name.erase(it);
  }
  // What is left names no parameter.
  if (!by_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", by_name.begin()->first, ": not in the model"));
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) params[i].second.copy_(*sources[i]);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> TensorParallelModel::GatherFull() {
  return Gather(shard_->NamedParameters());
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> TensorParallelModel::GatherFullOf(
    const std::vector<at::Tensor>& local) {
  RLMESH_ASSIGN_OR_RETURN(auto named, TrainedNamed(local));
  return Gather(named);
}

absl::Status TensorParallelModel::VisitFull(const Visit& visit) {
  return VisitGathered(shard_->NamedParameters(), visit);
}

absl::Status TensorParallelModel::VisitFullOf(const std::vector<at::Tensor>& local, const Visit& visit) {
  RLMESH_ASSIGN_OR_RETURN(auto named, TrainedNamed(local));
  return VisitGathered(named, visit);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> TensorParallelModel::FullShapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [name, p] : shard_->NamedParameters()) {
    std::vector<int64_t> shape = p.sizes().vec();
    const int dim = TensorParallelSplitDim(name);
    if (dim >= 0) shape[dim] *= size_;
    out.emplace_back(name, std::move(shape));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> TensorParallelModel::TrainedNamed(
    const std::vector<at::Tensor>& local) const {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (auto& [name, p] : shard_->NamedParameters()) {
    if (Trained(name)) named.emplace_back(name, p);
  }
  if (local.size() != named.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("local: ", local.size(), " tensors for ", named.size(), " trained parameters"));
  }
  for (size_t i = 0; i < local.size(); ++i) {
    if (!local[i].defined() || local[i].sizes() != named[i].second.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat("local[", i, "] (", named[i].first, "): expected shape ",
                                                     c10::str(named[i].second.sizes())));
    }
    named[i].second = local[i];
  }
  return named;
}

absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> TensorParallelModel::Gather(
    const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  RLMESH_RETURN_IF_ERROR(VisitGathered(named, [&](const std::string& name, const at::Tensor& full) {
    out.emplace_back(name, full.clone());
    return absl::OkStatus();
  }));
  return out;
}

absl::Status TensorParallelModel::VisitGathered(const std::vector<std::pair<std::string, at::Tensor>>& named,
                                                const Visit& visit) {
  absl::Status first;
  RLMESH_RETURN_IF_ERROR(dist::Collective("tensor-parallel gather", [&] {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < named.size(); ++i) {
      const std::string& name = named[i].first;
      const at::Tensor t = named[i].second.detach();
      const int dim = TensorParallelSplitDim(name);
      at::Tensor full = t;
      if (dim >= 0 && size_ > 1) {
        // Slices stacked along a new leading dim, then laid side by side
        // along the split dim.
        at::Tensor stacked = AllGathered(group_.get(), t.unsqueeze(0));
        full = at::cat(stacked.unbind(0), dim);
      }
      // Every rank gathers every parameter whatever a visit returned (the
      // others wait in the gathers); the first error is kept.
      if (first.ok()) first = visit(name, full);
    }
  }));
  return first;
}

at::Tensor TensorParallelModel::ForwardStream(const at::Tensor& ids, const at::Tensor& positions,
                                              const at::Tensor& attention_mask) {
  const int64_t B = ids.size(0), T = ids.size(1), H = config_.hidden_size;
  const bool tp = size_ > 1;
  const bool sp = tp && options_.sequence_parallel;
  const int64_t key = GroupKey(group_.get());
  auto* backbone = shard_->model.get();
  // Rows of the flattened [B*T, H] stream, padded to a multiple of tp under
  // sequence parallelism so that every rank holds the same number.
  const int64_t rows = B * T;
  const int64_t padded = sp ? (rows + size_ - 1) / size_ * size_ : rows;
  // By value, all of them: a checkpointed block runs them again in the
  // backward pass, after this call has returned.
  auto to_rows = [=](const at::Tensor& x) {  // [B,T,H] -> [padded, H]
    auto flat = x.reshape({rows, H});
    return padded == rows ? flat : at::constant_pad_nd(flat, {0, 0, 0, padded - rows});
  };
  auto from_rows = [=](const at::Tensor& x) {  // [padded, H] -> [B,T,H]
    return x.narrow(0, 0, rows).reshape({B, T, H});
  };

  at::Tensor h = Embed(ids);
  if (sp) {
    h = ScatterRows::apply(to_rows(h), key);  // [padded / tp, H]
  } else if (tp) {
    h = ReduceFromShards::apply(h, key);
  }
  auto [cos, sin] = actor::RopeCosSin(config_, rope_, positions, h.scalar_type());
  at::Tensor mask = actor::AttentionMask4d(attention_mask, T, h.device());

  // A block's input: the replicated [B,T,H] a column-parallel projection takes.
  auto enter = [=](const at::Tensor& x) {
    if (sp) return from_rows(GatherRows::apply(x, key));
    return tp ? CopyToShards::apply(x, key) : x;
  };
  // A block's partial output back into the stream's layout.
  auto leave = [=](const at::Tensor& y) {
    if (sp) return ScatterRows::apply(to_rows(y), key);
    return tp ? ReduceFromShards::apply(y, key) : y;
  };
  for (const auto& module : *backbone->layers) {
    auto* layer = module->as<actor::DecoderLayerImpl>();
    // cos and sin are structured bindings: captured by name (C++17 lambdas
    // cannot capture a binding itself).
    auto block = [=, cos = cos, sin = sin](const at::Tensor& x) {
      at::Tensor y = x + leave(layer->self_attn->Full(enter(layer->input_layernorm(x)), cos, sin, mask, nullptr,
                                                      nullptr));
      return y + leave(layer->mlp(enter(layer->post_attention_layernorm(y))));
    };
    h = options_.activation_checkpointing ? actor::CheckpointedBlock(block, h) : block(h);
  }
  return backbone->norm(h);
}

at::Tensor TensorParallelModel::ForwardHidden(const at::Tensor& ids, const at::Tensor& positions,
                                              const at::Tensor& attention_mask) {
  at::Tensor h = ForwardStream(ids, positions, attention_mask);
  if (size_ == 1) return h;
  // The output projection is column-parallel over the vocabulary: its input
  // is the replicated [B,T,H].
  const int64_t key = GroupKey(group_.get());
  if (!options_.sequence_parallel) return CopyToShards::apply(h, key);
  const int64_t B = ids.size(0), T = ids.size(1), H = config_.hidden_size;
  return GatherRows::apply(h, key).narrow(0, 0, B * T).reshape({B, T, H});
}

absl::StatusOr<at::Tensor> TensorParallelModel::Values(const at::Tensor& ids, const at::Tensor& positions,
                                                       const at::Tensor& attention_mask) {
  if (!config_.value_head) {
    return absl::FailedPreconditionError("Values: the model has no value head (config.value_head=false)");
  }
  // The ids stand in for targets: only their shapes and range are checked.
  RLMESH_RETURN_IF_ERROR(ValidateTokenInputs(ids, positions, ids, 1.0, config_.vocab_size));
  try {
    // The value head is replicated: each rank scores the stream it holds.
    // Without sequence parallelism that is every row, and the gradient is
    // whole on every rank; with it, each rank's own rows, gathered.
    at::Tensor v = shard_->ValuesFromHidden(ForwardStream(ids, positions, attention_mask));
    if (size_ == 1 || !options_.sequence_parallel) return v;
    const int64_t B = ids.size(0), T = ids.size(1);
    return GatherOwnRows::apply(v, GroupKey(group_.get())).narrow(0, 0, B * T).reshape({B, T});
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat("tensor-parallel values failed: ", e.what()));
  }
}

absl::StatusOr<actor::TokenLogProbsOutput> TensorParallelModel::TokenLogProbs(const at::Tensor& ids,
                                                                             const at::Tensor& positions,
                                                                             const at::Tensor& targets,
                                                                             double temperature,
                                                                             const at::Tensor& attention_mask) {
  RLMESH_RETURN_IF_ERROR(ValidateTokenInputs(ids, positions, targets, temperature, config_.vocab_size));
  try {
    return VocabParallelLogProbs(ForwardHidden(ids, positions, attention_mask), shard_->LmHeadWeight(), targets,
                                 temperature, group_.get());
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat("tensor-parallel log-probs failed: ", e.what()));
  }
}

at::Tensor TensorParallelModel::Prefill(const at::Tensor& ids, const at::Tensor& lens, int64_t capacity,
                                        actor::KvCache* cache) {
  at::NoGradGuard no_grad;
  const int64_t B = ids.size(0), T = ids.size(1);
  TORCH_CHECK(capacity >= T, "Prefill: capacity ", capacity, " < prompt width ", T);
  auto* backbone = shard_->model.get();
  auto positions = at::arange(T, ids.options()).unsqueeze(0).expand({B, T});
  at::Tensor h = SumOverShards(Embed(ids));
  auto [cos, sin] = actor::RopeCosSin(config_, rope_, positions, h.scalar_type());
  cache->k.clear();
  cache->v.clear();
  const int64_t kvh = shard_config_.num_kv_heads, d = shard_config_.HeadDim();
  for (const auto& module : *backbone->layers) {
    auto* layer = module->as<actor::DecoderLayerImpl>();
    at::Tensor k, v;
    h = h + SumOverShards(layer->self_attn->Full(layer->input_layernorm(h), cos, sin, {}, &k, &v));
    h = h + SumOverShards(layer->mlp(layer->post_attention_layernorm(h)));
    auto kc = at::zeros({B, kvh, capacity, d}, k.options());
    auto vc = at::zeros({B, kvh, capacity, d}, v.options());
    kc.narrow(2, 0, T).copy_(k);
    vc.narrow(2, 0, T).copy_(v);
    cache->k.push_back(kc);
    cache->v.push_back(vc);
  }
  auto last = (lens - 1).clamp_min(0);
  h = h.index({at::arange(B, lens.options()), last});
  return backbone->norm(h);
}

at::Tensor TensorParallelModel::DecodeStep(const at::Tensor& ids, const at::Tensor& lens, int64_t max_len,
                                           actor::KvCache* cache) {
  at::NoGradGuard no_grad;
  const int64_t N = ids.size(0), used = max_len + 1;
  auto* backbone = shard_->model.get();
  at::Tensor h = SumOverShards(Embed(ids.view({N, 1})));
  auto [cos, sin] = actor::RopeCosSin(config_, rope_, lens.view({N, 1}), h.scalar_type());
  auto key_mask = at::arange(used, lens.options()).view({1, used}).le(lens.view({N, 1})).view({N, 1, 1, used});
  size_t i = 0;
  for (const auto& module : *backbone->layers) {
    auto* layer = module->as<actor::DecoderLayerImpl>();
    h = h + SumOverShards(layer->self_attn->Decode(layer->input_layernorm(h), cos, sin, cache->k[i], cache->v[i],
                                                   lens, key_mask, used));
    h = h + SumOverShards(layer->mlp(layer->post_attention_layernorm(h)));
    ++i;
  }
  return backbone->norm(h).squeeze(1);
}

std::pair<at::Tensor, at::Tensor> TensorParallelModel::GreedyNext(const at::Tensor& hidden) {
  at::NoGradGuard no_grad;
  at::Tensor z = at::matmul(hidden, shard_->LmHeadWeight().t()).to(at::kFloat);  // [N, V/tp]
  auto [local_max, local_arg] = z.max(-1);
  const int64_t v_begin = rank_ * shard_config_.vocab_size;
  at::Tensor best = size_ > 1 ? AllReduced(group_.get(), local_max, c10d::ReduceOp::MAX) : local_max;
  // Among the ranks holding the maximum, the lowest id wins.
  at::Tensor candidate = at::where(local_max.eq(best), local_arg + v_begin,
                                   at::full_like(local_arg, std::numeric_limits<int64_t>::max()));
  at::Tensor id = size_ > 1 ? AllReduced(group_.get(), candidate, c10d::ReduceOp::MIN) : candidate;
  at::Tensor sum_e = (z - best.unsqueeze(-1)).exp().sum(-1);
  if (size_ > 1) sum_e = AllReduced(group_.get(), sum_e);
  return {id, -sum_e.log()};
}

at::Tensor TensorParallelModel::Logits(const at::Tensor& hidden) {
  at::NoGradGuard no_grad;
  at::Tensor z = at::matmul(hidden, shard_->LmHeadWeight().t());  // [N, V/tp]
  if (size_ == 1) return z;
  const int64_t n = z.size(0), v_local = z.size(1);
  // [tp * N, V/tp] in rank order -> [N, tp, V/tp] -> [N, V].
  return AllGathered(group_.get(), z).view({size_, n, v_local}).transpose(0, 1).reshape({n, size_ * v_local});
}

at::Tensor TensorParallelModel::Embed(const at::Tensor& ids) { return VocabParallelLookup(*shard_, ids, rank_); }

at::Tensor TensorParallelModel::SumOverShards(const at::Tensor& partial) {
  return size_ > 1 ? AllReduced(group_.get(), partial) : partial;
}

std::vector<std::pair<std::string, at::Tensor>> TensorParallelModel::NamedParameters() const {
  return shard_->NamedParameters();
}

std::vector<at::Tensor> TensorParallelModel::Parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [name, p] : shard_->NamedParameters()) out.push_back(p);
  return out;
}

std::vector<at::Tensor> TensorParallelModel::TrainedParameters() const {
  std::vector<at::Tensor> out;
  for (auto& [name, p] : shard_->NamedParameters()) {
    if (Trained(name)) out.push_back(p);
  }
  return out;
}

std::vector<double> TensorParallelModel::NormWeights() const {
  std::vector<double> out;
  for (auto& [name, p] : shard_->NamedParameters()) {
    if (Trained(name)) out.push_back(TensorParallelSplitDim(name) >= 0 ? 1.0 : 1.0 / size_);
  }
  return out;
}

}  // namespace rlmesh::parallel
