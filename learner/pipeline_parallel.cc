#include "learner/pipeline_parallel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actor/attention_inputs.h"
#include "actor/rope.h"
#include "actor/transformer.h"
#include "common/status_macros.h"
#include "learner/tensor_checks.h"
#include "parallel/layout_shapes.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/tensor_parallel.h"
#include "parallel/token_inputs.h"

namespace rlmesh::learner {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr const char* kEmbedding = "model.embed_tokens.weight";

// The decoder layer a parameter belongs to, or -1 (embedding, norm, head).
int64_t LayerOf(const std::string& name) {
  if (!absl::StartsWith(name, "model.layers.")) return -1;
  return std::stoll(name.substr(13, name.find('.', 13) - 13));
}

}  // namespace

absl::Status ValidatePipeline(const actor::ModelConfig& config, int stages, const std::vector<int64_t>& stage_layers,
                              int virtual_stages) {
  if (config.NumMoeLayers() > 0) {
    return absl::UnimplementedError("learner.pp: pipeline parallelism is not built for MoE models");
  }
  if (config.value_head) {
    return absl::UnimplementedError(
        "learner.pp: pipeline parallelism is not built for value-head models (reward models, critics)");
  }
  if (stages < 1) return absl::InvalidArgumentError(absl::StrCat("learner.pp: must be >= 1, got ", stages));
  if (virtual_stages < 1 || (virtual_stages > 1 && stages < 2)) {
    return absl::InvalidArgumentError(absl::StrCat("learner.pp_virtual_stages: must be 1, or > 1 with learner.pp > 1; got ",
                                                   virtual_stages, " at learner.pp ", stages));
  }
  const int chunks = stages * virtual_stages;
  if (stage_layers.empty()) return parallel::PipelineChunkLayers(config, stages, virtual_stages).status();
  if (static_cast<int>(stage_layers.size()) != chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("learner.pp_layers: ", stage_layers.size(), " entries for ", stages, " stages",
                     virtual_stages > 1 ? absl::StrCat(" x ", virtual_stages, " virtual stages") : ""));
  }
  int64_t sum = 0;
  for (size_t s = 0; s < stage_layers.size(); ++s) {
    if (stage_layers[s] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("learner.pp_layers[", s, "]: must be >= 1, got ", stage_layers[s]));
    }
    sum += stage_layers[s];
  }
  if (sum != config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("learner.pp_layers: sum to ", sum,
                                                   ", the model has num_layers ", config.num_layers));
  }
  return absl::OkStatus();
}

struct PipelineModel::Impl {
  actor::Transformer model{nullptr};
  actor::RopeFrequencies rope;
  PipelineOptions options;
  c10::intrusive_ptr<c10d::Backend> pipeline;
  // The stage's tensor-parallel group; null without one.
  c10::intrusive_ptr<c10d::Backend> tp;
  actor::ModelConfig config;
  // Every parameter of the whole model in NamedParameters() order: its
  // name, shape, stage, and where it starts in the whole model's flat
  // layout and in its stage's (the stage's parameters in this order); the
  // dimension tensor parallelism splits (-1: none), and on this stage the
  // shape this rank holds and where it starts in the optimizer's flat
  // layout of the stage.
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    int stage = 0;
    int64_t offset = 0, stage_offset = 0, numel = 0;
    int split = -1;
    std::vector<int64_t> held_shape;
    int64_t held_offset = 0, held_numel = 0;
  };
  std::vector<Param> all;
  std::map<std::string, size_t> index;
  // Elements of each stage's parameters, whole (its tied copy not counted).
  std::vector<int64_t> stage_numel;
  // This stage's parameters by name (the module's tensors) and, on the last
  // stage of a tied model split over stages, the embedding's copy.
  std::map<std::string, at::Tensor> mine;
  at::Tensor tied_copy;
  // What the optimizer steps: `mine` in NamedParameters() order, then the
  // tied copy.
  std::vector<at::Tensor> trained;
  std::unique_ptr<DataParallel> optimizer;
  // Asynchronous sends not yet known complete, with their buffers.
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> pending;
  double wait_seconds = 0;
  // This stage's model chunks' decoder layers, [begin, end) each; chunk v
  // is the model's chunk v x P + stage.
  std::vector<std::pair<int64_t, int64_t>> chunk_layers;

  int stage() const { return pipeline ? pipeline->getRank() : 0; }
  int tp_rank() const { return tp ? tp->getRank() : 0; }
  int tp_size() const { return tp ? tp->getSize() : 1; }

  // `held` (shaped like this rank's slice of p) joined whole over the
  // tensor-parallel group; `held` itself when p is not split.
  at::Tensor Join(const Param& p, const at::Tensor& held) const {
    if (!tp || p.split < 0) return held;
    std::vector<at::Tensor> in{held.contiguous()};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < tp_size(); ++r) out[0].push_back(at::empty_like(in[0]));
    tp->allgather(out, in)->wait();
    return parallel::JoinTensorParallelPieces(p.name, out[0]);
  }
  // This rank's slice of `whole` (shaped like p).
  at::Tensor Slice(const Param& p, const at::Tensor& whole) const {
    if (!tp || p.split < 0) return whole;
    const int64_t n = p.held_shape[p.split];
    return whole.narrow(p.split, tp_rank() * n, n);
  }
  int stages() const { return pipeline ? pipeline->getSize() : 1; }
  int chunks() const { return static_cast<int>(chunk_layers.size()); }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }
  // The model's chunk index of this stage's chunk v.
  int64_t ModelChunk(int v) const { return static_cast<int64_t>(v) * stages() + stage(); }
  // Whether chunk v is the model's first (it embeds) or last (it scores).
  bool FirstChunk(int v) const { return ModelChunk(v) == 0; }
  bool LastChunk(int v) const { return ModelChunk(v) == static_cast<int64_t>(stages()) * chunks() - 1; }

  // One tag per message of a call: micro-batch, the sending model chunk and
  // the direction (0: activations forward, 1: gradients backward). Below
  // 2^30, the tied exchange's tag.
  int Tag(int direction, int64_t micro, int64_t from_chunk) const {
    const int64_t n = static_cast<int64_t>(stages()) * chunks();
    return static_cast<int>(((micro * n + from_chunk) * 2 + direction) % (1 << 30));
  }

  // Sends chunk v's output forward (direction 0) or its input's gradient
  // backward (1) to the stage holding the next or previous model chunk.
  void Send(int direction, int64_t micro, int v, at::Tensor t) {
    t = t.contiguous();
    std::vector<at::Tensor> buffers{t};
    const int peer = (stage() + (direction == 0 ? 1 : stages() - 1)) % stages();
    auto work = pipeline->send(buffers, peer, Tag(direction, micro, ModelChunk(v)));
    pending.emplace_back(std::move(work), std::move(t));
    // Drop the buffers of sends already done.
    pending.erase(std::remove_if(pending.begin(), pending.end(), [](const auto& p) { return p.first->isCompleted(); }),
                  pending.end());
  }

  // Receives chunk v's input (direction 0) or its output's gradient (1).
  at::Tensor Recv(int direction, int64_t micro, int v, const std::vector<int64_t>& shape) {
    std::vector<at::Tensor> buffers{at::empty(shape, at::kFloat)};
    const int peer = (stage() + (direction == 0 ? stages() - 1 : 1)) % stages();
    const int64_t from = ModelChunk(v) + (direction == 0 ? -1 : 1);
    const auto t = Clock::now();
    pipeline->recv(buffers, peer, Tag(direction, micro, from))->wait();
    wait_seconds += Since(t);
    return buffers[0];
  }

  void WaitSends() {
    const auto t = Clock::now();
    for (auto& p : pending) p.first->wait();
    pending.clear();
    wait_seconds += Since(t);
  }

  // Chunk v's forward of micro-batch `micro`: the hidden states it hands on
  // ([rows, T, H] after its layers). `input` receives the chunk's input
  // (the received activations; undefined on the model's first chunk), a
  // leaf that requires grad when `grad`.
  at::Tensor Forward(const PipelineMicroBatch& mb, int64_t micro, int v, bool grad, at::Tensor* input) {
    const int64_t B = mb.ids.size(0), T = mb.ids.size(1), H = model->config().hidden_size;
    at::Tensor h;
    auto* backbone = model->model.get();
    if (FirstChunk(v)) {
      h = tp ? parallel::ReduceFromTensorParallel(parallel::VocabParallelLookup(*model, mb.ids, tp_rank()), tp.get())
             : backbone->embed_tokens(mb.ids);
    } else {
      *input = Recv(0, micro, v, {B, T, H});
      if (grad) input->requires_grad_(true);
      h = *input;
    }
    auto [cos, sin] = actor::RopeCosSin(config, rope, mb.positions, h.scalar_type());
    const at::Tensor mask = actor::AttentionMask4d(mb.attention_mask, T, h.device());
    for (int64_t l = chunk_layers[v].first; l < chunk_layers[v].second; ++l) {
      auto* layer = (*backbone->layers)[l]->as<actor::DecoderLayerImpl>();
      c10d::Backend* group = tp.get();
      auto run = [layer, cos = cos, sin = sin, mask, group](const at::Tensor& x) {
        return group != nullptr ? parallel::TensorParallelLayer(*layer, x, cos, sin, mask, group)
                                : layer->Forward(x, cos, sin, mask, nullptr);
      };
      // Checkpointed (when the pass builds a graph), the layer keeps only
      // its input and runs again in this micro-batch's backward.
      h = options.activation_checkpointing ? actor::CheckpointedBlock(run, h) : run(h);
    }
    return h;
  }

  // The last stage's log-probs and entropies from its hidden states.
  actor::TokenLogProbsOutput Head(const at::Tensor& h, const at::Tensor& targets, double temperature) {
    const at::Tensor weight = tied_copy.defined() ? tied_copy : model->LmHeadWeight();
    if (tp) {
      // The head is vocabulary-parallel: no rank holds the [rows, T, V]
      // logits.
      return parallel::VocabParallelLogProbs(parallel::CopyToTensorParallel(model->model->norm(h), tp.get()), weight,
                                             targets, temperature, tp.get());
    }
    auto out = actor::TokenLogProbsFromHidden(model->model->norm(h), weight, targets, options.logprob_chunk,
                                              temperature);
    TORCH_CHECK(out.ok(), out.status().ToString());
    return *out;
  }
};

PipelineModel::~PipelineModel() = default;

absl::StatusOr<std::unique_ptr<PipelineModel>> PipelineModel::Create(const actor::ModelConfig& config,
                                                                     c10::intrusive_ptr<c10d::Backend> pipeline,
                                                                     const PipelineOptions& options) {
  const int stages = pipeline ? pipeline->getSize() : 1, V = options.virtual_stages;
  const int tp = options.tensor_parallel ? options.tensor_parallel->getSize() : 1;
  RLMESH_RETURN_IF_ERROR(ValidatePipeline(config, stages, options.stage_layers, V));
  if (tp > 1) RLMESH_RETURN_IF_ERROR(parallel::ValidateTensorParallel(config, tp));
  if (options.logprob_chunk <= 0) return absl::InvalidArgumentError("logprob_chunk: must be > 0");
  if (!options.optimizer.norm_groups.empty() || !options.optimizer.norm_weights.empty() ||
      !options.optimizer.norm_ranges.empty()) {
    return absl::InvalidArgumentError("optimizer: the pipeline sets the norm groups and weights itself");
  }
  // Decoder layers per model chunk (chunk c on stage c % P).
  std::vector<int64_t> layers = options.stage_layers;
  if (layers.empty()) {
    RLMESH_ASSIGN_OR_RETURN(layers, parallel::PipelineChunkLayers(config, stages, V));
  }
  std::unique_ptr<PipelineModel> m(new PipelineModel());
  m->impl_ = std::make_unique<Impl>();
  Impl& im = *m->impl_;
  m->config_ = config;
  m->stages_ = stages;
  m->stage_ = pipeline ? pipeline->getRank() : 0;
  im.options = options;
  im.pipeline = stages > 1 ? pipeline : nullptr;
  im.tp = tp > 1 ? options.tensor_parallel : nullptr;
  im.config = config;
  std::vector<int> chunk_of_layer;
  for (size_t c = 0; c < layers.size(); ++c) {
    if (static_cast<int>(c) % stages == m->stage_) {
      const auto begin = static_cast<int64_t>(chunk_of_layer.size());
      im.chunk_layers.emplace_back(begin, begin + layers[c]);
    }
    chunk_of_layer.insert(chunk_of_layer.end(), layers[c], static_cast<int>(c));
  }
  try {
    // Under tensor parallelism the module is this rank's slice of every
    // stage (parallel::TensorParallelShardConfig's shape).
    im.model = actor::Transformer(parallel::TensorParallelShardConfig(config, tp));
    im.rope = actor::ComputeRope(config);
    auto stage_of = [&](const std::string& name) {
      const int64_t l = LayerOf(name);
      if (l < 0) return name == kEmbedding ? 0 : stages - 1;
      return chunk_of_layer[l] % stages;
    };
    at::NoGradGuard no_grad;
    const bool tied_copy = config.tie_embeddings && stages > 1 && m->stage_ == stages - 1;
    im.stage_numel.assign(stages, 0);
    int64_t offset = 0, held_offset = 0;
    for (auto& [name, p] : im.model->NamedParameters()) {
      const int s = stage_of(name);
      Impl::Param param{name, p.sizes().vec(), s, offset, im.stage_numel[s], p.numel()};
      if (tp > 1) {
        param.split = parallel::TensorParallelSplitDim(name);
        if (param.split >= 0) param.shape[param.split] *= tp;
        param.numel = std::accumulate(param.shape.begin(), param.shape.end(), int64_t{1}, std::multiplies<>());
      }
      param.held_shape = p.sizes().vec();
      param.held_numel = p.numel();
      offset += param.numel;
      im.stage_numel[s] += param.numel;
      if (s == m->stage_) {
        param.held_offset = held_offset;
        held_offset += p.numel();
        im.mine[name] = p;
        im.trained.push_back(p);
        if (tp > 1 && parallel::TensorParallelGradientIsPartial(name, /*sequence_parallel=*/false)) {
          // Each slice saw only its own heads' share of this gradient.
          c10::intrusive_ptr<c10d::Backend> group = im.tp;
          p.register_hook([group](const at::Tensor& g) {
            std::vector<at::Tensor> sum{g.clone()};
            group->allreduce(sum)->wait();
            return sum[0];
          });
        }
      } else if (name == kEmbedding && tied_copy) {
        im.tied_copy = p;
      } else {
        p.set_data(at::empty({0}, p.options()));
      }
      im.index[name] = im.all.size();
      im.all.push_back(std::move(param));
    }
    if (im.tied_copy.defined()) im.trained.push_back(im.tied_copy);
    if (!options.trainable) {
      for (at::Tensor& p : im.trained) p.set_requires_grad(false);
      return m;
    }
    DataParallelOptions o = options.optimizer;
    if (im.pipeline || im.tp) {
      // The whole model's norm: summed over the stages and the slices, a
      // replicated parameter weighing 1/tp on each slice.
      for (const auto& g : {im.pipeline, im.tp}) {
        if (g) o.norm_groups.push_back(g);
      }
      for (const Impl::Param& q : im.all) {
        if (q.stage == m->stage_) o.norm_weights.push_back(q.split >= 0 || tp == 1 ? 1.0 : 1.0 / tp);
      }
      if (im.tied_copy.defined()) o.norm_weights.push_back(0.0);  // counted once, on the first stage
    }
    RLMESH_ASSIGN_OR_RETURN(im.optimizer, DataParallel::Create(options.data_parallel, im.trained, o));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("pipeline stage: ", e.what()));
  }
  return m;
}

absl::Status PipelineModel::LoadFromFull(const Named& full) {
  Impl& im = *impl_;
  std::map<std::string, at::Tensor> by_name(full.begin(), full.end());
  if (im.tp) {
    // This rank's slices of the whole tensors (a misshapen one is left
    // whole, for CopyNamed to name).
    for (auto& [name, t] : by_name) {
      auto it = im.index.find(name);
      if (it == im.index.end()) continue;
      const Impl::Param& p = im.all[it->second];
      if (t.sizes().vec() == p.shape) t = im.Slice(p, t);
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : im.mine) RLMESH_RETURN_IF_ERROR(internal::CopyNamed(by_name, name, p));
  if (im.tied_copy.defined()) RLMESH_RETURN_IF_ERROR(internal::CopyNamed(by_name, kEmbedding, im.tied_copy));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<actor::TokenLogProbsOutput>> PipelineModel::LogProbs(
    const std::vector<PipelineMicroBatch>& micro, double temperature) {
  Impl& im = *impl_;
  for (const PipelineMicroBatch& mb : micro) {
    RLMESH_RETURN_IF_ERROR(
        parallel::ValidateTokenInputs(mb.ids, mb.positions, mb.targets, temperature, config_.vocab_size));
  }
  std::vector<actor::TokenLogProbsOutput> out(micro.size());
  try {
    at::NoGradGuard no_grad;
    // Micro-batch by micro-batch, each through this stage's chunks in
    // order: every pass's input was sent by a pass earlier in that order.
    for (size_t k = 0; k < micro.size(); ++k) {
      for (int v = 0; v < im.chunks(); ++v) {
        at::Tensor input;
        at::Tensor h = im.Forward(micro[k], k, v, /*grad=*/false, &input);
        if (im.LastChunk(v)) {
          out[k] = im.Head(h, micro[k].targets, temperature);
        } else {
          im.Send(0, k, v, h);
        }
      }
    }
    im.WaitSends();
    if (im.pipeline) {
      // The last stage's results, to every stage.
      c10d::BroadcastOptions root;
      root.rootRank = stages_ - 1;
      for (size_t k = 0; k < micro.size(); ++k) {
        std::vector<at::Tensor> both{im.last() ? at::stack({out[k].logprobs, out[k].entropy}).contiguous()
                                               : at::empty({2, micro[k].ids.size(0), micro[k].ids.size(1)},
                                                           at::kFloat)};
        im.pipeline->broadcast(both, root)->wait();
        out[k] = {both[0][0], both[0][1]};
      }
    }
  } catch (const std::exception& e) {
    im.pending.clear();
    return absl::AbortedError(absl::StrCat("pipeline log-probs failed: ", e.what()));
  }
  return out;
}

// Long because: the two kinds of pass (forward, backward), which the
// model's first and last chunks run differently, kept beside the loop over
// the schedule so the order of sends and receives reads in one place.
absl::Status PipelineModel::Train(const std::vector<PipelineMicroBatch>& micro, double temperature,
                                  const LossFn& loss, PipelineTrace* trace) {
  Impl& im = *impl_;
  for (const PipelineMicroBatch& mb : micro) {
    RLMESH_RETURN_IF_ERROR(
        parallel::ValidateTokenInputs(mb.ids, mb.positions, mb.targets, temperature, config_.vocab_size));
  }
  if (!im.optimizer) return absl::FailedPreconditionError("Train: the pipeline model is frozen");
  if (micro.empty()) return absl::InvalidArgumentError("Train: no micro-batches");
  RLMESH_ASSIGN_OR_RETURN(const std::vector<parallel::PipelineOp> schedule,
                          parallel::PipelineSchedule(stages_, stage_, im.chunks(), micro.size()));
  const auto t_start = Clock::now();
  im.wait_seconds = 0;
  PipelineTrace local;
  PipelineTrace& tr = trace ? *trace : local;
  tr = PipelineTrace();
  // Per (micro-batch, chunk) in flight: the chunk's input (a leaf;
  // undefined on the model's first chunk) and what its backward starts
  // from (the output, or the loss on the model's last chunk).
  struct InFlight {
    at::Tensor input, output;
  };
  std::map<std::pair<int64_t, int>, InFlight> flight;
  absl::Status loss_error;
  auto name = [&](const parallel::PipelineOp& op) {
    return im.chunks() == 1 ? absl::StrCat(op.forward ? "F" : "B", op.micro)
                            : absl::StrCat(op.forward ? "F" : "B", op.micro, ".", op.chunk);
  };
  auto forward = [&](int64_t k, int v) {
    InFlight f;
    at::Tensor h = im.Forward(micro[k], k, v, /*grad=*/true, &f.input);
    if (im.LastChunk(v)) {
      absl::StatusOr<at::Tensor> l = loss(k, im.Head(h, micro[k].targets, temperature));
      if (!l.ok()) {
        loss_error = l.status();
        throw std::runtime_error(l.status().ToString());
      }
      f.output = *l;
    } else {
      im.Send(0, k, v, h.detach());
      f.output = h;
    }
    flight[{k, v}] = std::move(f);
    tr.max_in_flight = std::max<int64_t>(tr.max_in_flight, flight.size());
  };
  auto backward = [&](int64_t k, int v) {
    InFlight& f = flight.at({k, v});
    if (im.LastChunk(v)) {
      torch::autograd::backward({f.output});
    } else {
      torch::autograd::backward({f.output}, {im.Recv(1, k, v, f.output.sizes().vec())});
    }
    if (!im.FirstChunk(v)) {
      at::Tensor g = f.input.grad();
      im.Send(1, k, v, g.defined() ? g : at::zeros_like(f.input));
    }
    flight.erase({k, v});
  };
  try {
    for (const parallel::PipelineOp& op : schedule) {
      tr.ops.push_back(name(op));
      if (op.forward) {
        forward(op.micro, op.chunk);
      } else {
        backward(op.micro, op.chunk);
      }
    }
    im.WaitSends();
  } catch (const std::exception& e) {
    im.pending.clear();
    if (!loss_error.ok()) return loss_error;
    return absl::AbortedError(absl::StrCat("pipeline stage ", stage_, " failed: ", e.what()));
  }
  tr.total_seconds = Since(t_start);
  tr.wait_seconds = im.wait_seconds;
  tr.compute_seconds = tr.total_seconds - tr.wait_seconds;
  return absl::OkStatus();
}

void PipelineModel::ZeroGrad() {
  if (impl_->optimizer) impl_->optimizer->ZeroGrad();
}

absl::StatusOr<DataParallelStepStats> PipelineModel::Step(double local_weight, double lr) {
  Impl& im = *impl_;
  if (!im.optimizer) return absl::FailedPreconditionError("Step: the pipeline model is frozen");
  if (im.pipeline && config_.tie_embeddings) {
    // The embedding's gradient on the first stage plus its copy's on the
    // last, on both: a + b and b + a round alike, so the two stay equal.
    try {
      const bool holder = im.first() || im.last();
      if (holder) {
        at::Tensor& w = im.first() ? im.mine.at(kEmbedding) : im.tied_copy;
        if (!w.grad().defined()) w.mutable_grad() = at::zeros_like(w);
        const int peer = im.first() ? stages_ - 1 : 0;
        std::vector<at::Tensor> mine{w.grad().contiguous()}, theirs{at::empty_like(w)};
        auto sent = im.pipeline->send(mine, peer, 1 << 30);
        im.pipeline->recv(theirs, peer, 1 << 30)->wait();
        sent->wait();
        w.mutable_grad().add_(theirs[0]);
      }
    } catch (const std::exception& e) {
      return absl::AbortedError(absl::StrCat("pipeline tied embedding exchange failed: ", e.what()));
    }
  }
  return im.optimizer->Step(local_weight, lr);
}

absl::StatusOr<PipelineModel::Named> PipelineModel::GatherFull() {
  Impl& im = *impl_;
  Named out;
  try {
    for (const Impl::Param& p : im.all) {
      std::vector<at::Tensor> t{p.stage == stage_ ? im.Join(p, im.mine.at(p.name).detach()).clone()
                                                  : at::empty(p.shape, at::kFloat)};
      if (im.pipeline) {
        c10d::BroadcastOptions root;
        root.rootRank = p.stage;
        im.pipeline->broadcast(t, root)->wait();
      }
      out.emplace_back(p.name, t[0]);
    }
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat("pipeline gather failed: ", e.what()));
  }
  return out;
}

absl::StatusOr<PipelineModel::Named> PipelineModel::GatherToFirst() {
  Impl& im = *impl_;
  if (!im.pipeline && !im.tp) return GatherFull();
  // Tags above the schedule's (which stay below 2^30) and the tied
  // exchange's (2^30).
  constexpr int kTagBase = (1 << 30) + 1;
  // Slice 0 of each stage joins its stage's parameters over the slices and
  // sends them on; slice 0 of the first stage receives.
  const bool root = stage_ == 0 && im.tp_rank() == 0;
  Named out;
  try {
    std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> sends;
    for (size_t i = 0; i < im.all.size(); ++i) {
      const Impl::Param& p = im.all[i];
      if (p.stage == stage_) {
        std::vector<at::Tensor> t{im.Join(p, im.mine.at(p.name).detach()).contiguous()};
        if (root) {
          out.emplace_back(p.name, t[0].clone());
        } else if (stage_ != 0 && im.tp_rank() == 0) {
          sends.emplace_back(im.pipeline->send(t, 0, kTagBase + static_cast<int>(i)), t[0]);
        }
      } else if (root) {
        std::vector<at::Tensor> t{at::empty(p.shape, at::kFloat)};
        im.pipeline->recv(t, p.stage, kTagBase + static_cast<int>(i))->wait();
        out.emplace_back(p.name, t[0]);
      }
    }
    for (auto& s : sends) s.first->wait();
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat("pipeline gather to the first stage failed: ", e.what()));
  }
  return out;
}

absl::StatusOr<std::pair<at::Tensor, at::Tensor>> PipelineModel::GatherMoments() {
  Impl& im = *impl_;
  if (!im.optimizer) return absl::FailedPreconditionError("GatherMoments: the pipeline model is frozen");
  const std::vector<int64_t>& counts = im.stage_numel;
  std::vector<at::Tensor> m, v;
  try {
    // This stage's moments, [2, its flat elements] (the tied copy's last).
    at::Tensor mine = at::stack({im.optimizer->exp_avg(), im.optimizer->exp_avg_sq()});
    const c10::intrusive_ptr<c10d::Backend>& replicas = im.options.data_parallel;
    if (im.options.optimizer.zero1 && replicas && replicas->getSize() > 1) {
      // ZeRO-1: the replicas' equal shares of the zero-padded flat layout.
      std::vector<at::Tensor> in{mine.contiguous()};
      std::vector<std::vector<at::Tensor>> out(1);
      for (int r = 0; r < replicas->getSize(); ++r) out[0].push_back(at::empty_like(in[0]));
      replicas->allgather(out, in)->wait();
      mine = at::cat(out[0], 1);
    }
    // This stage's moments in its whole parameters' layout, [2, elements].
    if (im.tp) {
      std::vector<at::Tensor> parts;
      for (const Impl::Param& p : im.all) {
        if (p.stage != stage_) continue;
        const at::Tensor held = mine.narrow(1, p.held_offset, p.held_numel);
        parts.push_back(at::stack({im.Join(p, held[0].reshape(p.held_shape)).reshape({-1}),
                                   im.Join(p, held[1].reshape(p.held_shape)).reshape({-1})}));
      }
      mine = at::cat(parts, 1);
    }
    std::vector<at::Tensor> stage_moments;
    for (int s = 0; s < stages_; ++s) {
      std::vector<at::Tensor> both{s == stage_ ? mine.narrow(1, 0, counts[s]).contiguous()
                                               : at::empty({2, counts[s]}, at::kFloat)};
      if (im.pipeline) {
        c10d::BroadcastOptions root;
        root.rootRank = s;
        im.pipeline->broadcast(both, root)->wait();
      }
      stage_moments.push_back(both[0]);
    }
    // The whole model's layout, parameter by parameter (a stage's
    // parameters are not contiguous in it under the interleaved schedule).
    for (const Impl::Param& p : im.all) {
      const at::Tensor part = stage_moments[p.stage].narrow(1, p.stage_offset, p.numel);
      m.push_back(part[0]);
      v.push_back(part[1]);
    }
  } catch (const std::exception& e) {
    return absl::AbortedError(absl::StrCat("pipeline moments gather failed: ", e.what()));
  }
  return std::make_pair(at::cat(m), at::cat(v));
}

absl::Status PipelineModel::LoadMoments(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, int64_t steps) {
  Impl& im = *impl_;
  if (!im.optimizer) return absl::FailedPreconditionError("LoadMoments: the pipeline model is frozen");
  const std::vector<int64_t>& n = im.stage_numel;
  const int64_t total = std::accumulate(n.begin(), n.end(), int64_t{0});
  if (exp_avg.numel() != total || exp_avg_sq.numel() != total) {
    return absl::InvalidArgumentError(absl::StrCat("moments: ", exp_avg.numel(), " and ", exp_avg_sq.numel(),
                                                   " elements, the model has ", total));
  }
  auto part = [&](const at::Tensor& whole) {
    at::Tensor flat = whole.reshape({-1}).to(at::kFloat);
    auto held = [&](const Impl::Param& p) {
      return im.Slice(p, flat.narrow(0, p.offset, p.numel).view(p.shape)).reshape({-1});
    };
    std::vector<at::Tensor> mine;
    for (const Impl::Param& p : im.all) {
      if (p.stage == stage_) mine.push_back(held(p));
    }
    // The tied copy's moments are the embedding's.
    if (im.tied_copy.defined()) mine.push_back(held(im.all[im.index.at(kEmbedding)]));
    return at::cat(mine);
  };
  // Under ZeRO-1 the optimizer keeps its share.
  return im.options.optimizer.zero1 ? im.optimizer->LoadWholeOptimizerState(part(exp_avg), part(exp_avg_sq), steps)
                                    : im.optimizer->LoadOptimizerState(part(exp_avg), part(exp_avg_sq), steps);
}

int PipelineModel::tensor_parallel_rank() const { return impl_->tp_rank(); }

int64_t PipelineModel::steps() const { return impl_->optimizer ? impl_->optimizer->steps() : 0; }

std::vector<std::pair<int64_t, int64_t>> PipelineModel::chunk_layers() const { return impl_->chunk_layers; }

PipelineModel::Named PipelineModel::StageParameters() const {
  Named out;
  for (const Impl::Param& p : impl_->all) {
    if (p.stage == stage_) out.emplace_back(p.name, impl_->mine.at(p.name));
  }
  return out;
}

}  // namespace rlmesh::learner
