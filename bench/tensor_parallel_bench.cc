// One rank of a tensor-parallel (parallel/tensor_parallel.h), fully
// sharded (ZeRO-3, learner/fully_sharded.h; --zero3_dp) or expert-parallel
// (learner/expert_parallel.h on a Qwen3-MoE of the same attention shape;
// --ep) training step, for bench/tensor_parallel.py and
// bench/expert_parallel.py, which start the ranks of each layout as
// separate processes (so that each has its own peak RSS) and alternate the
// layouts.
//
// Builds a Llama of the given shape from a fixed seed (every rank the same
// full weights, then its slice), runs --warmup + --steps training steps
// (vocabulary-parallel log-probs, token-mean loss, backward, AdamW through
// DataParallel with the norm over the TP group) on a fixed random batch, and
// writes one JSON line to --out: seconds per timed step, the first loss, the
// resident memory before the model was built, after the training state was
// set up and at its peak, and the
// rank's parameter count.
//
//   bench/tensor_parallel.py   (runs this binary; see bench/tensor_parallel.md)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "actor/logprobs.h"
#include "actor/transformer.h"
#include "dist/gloo.h"
#include "dist/store.h"
#include "learner/data_parallel.h"
#include "learner/expert_parallel.h"
#include "learner/fully_sharded.h"
#include "parallel/tensor_parallel.h"
#include "bench/process_memory.h"

ABSL_FLAG(int, tp, 1, "tensor-parallel ranks");
ABSL_FLAG(int, rank, 0, "this process's rank");
ABSL_FLAG(std::string, store, "", "FileStore path shared by the ranks (tp > 1)");
ABSL_FLAG(bool, sp, false, "sequence parallelism");
ABSL_FLAG(int64_t, hidden, 512, "hidden size");
ABSL_FLAG(int64_t, layers, 8, "decoder layers");
ABSL_FLAG(int64_t, heads, 8, "query heads");
ABSL_FLAG(int64_t, kv_heads, 4, "key/value heads");
ABSL_FLAG(int64_t, intermediate, 1408, "MLP width");
ABSL_FLAG(int64_t, vocab, 32000, "vocabulary");
ABSL_FLAG(int64_t, batch, 4, "rows per step");
ABSL_FLAG(int64_t, seq, 128, "tokens per row");
ABSL_FLAG(int, warmup, 1, "untimed steps");
ABSL_FLAG(int, steps, 3, "timed steps");
ABSL_FLAG(int, threads, 1, "intra-op threads");
ABSL_FLAG(std::string, out, "", "JSON line written here");
ABSL_FLAG(int, zero3_dp, 0,
          "> 0: this many ZeRO-3 data-parallel ranks instead of tensor parallelism (each runs batch / dp rows)");
ABSL_FLAG(bool, prefetch, true, "ZeRO-3: all-gather the next unit while this one computes");
ABSL_FLAG(int, ep, 0,
          "> 0: a Qwen3-MoE trained with this many expert-parallel ranks (each runs batch / ep rows); 1 = the "
          "whole MoE model in one process");
ABSL_FLAG(int64_t, experts, 8, "--ep: routed experts per MoE layer");
ABSL_FLAG(int64_t, experts_per_tok, 2, "--ep: experts per token");
ABSL_FLAG(int64_t, moe_intermediate, 704, "--ep: each expert's MLP width");

namespace rlmesh::learner {

using parallel::TensorParallelModel;
using parallel::TensorParallelOptions;

namespace {

using bench::PeakRssBytes;
using bench::RssBytes;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tensor_parallel_bench: %s\n", s.ToString().c_str());
  return 1;
}

// A rank's rows of the batch (rank r of `of` takes B / of rows) and their
// scored-token mask.
struct Rows {
  at::Tensor ids, pos, targets, valid;
};
Rows RowsOf(const at::Tensor& ids, const at::Tensor& pos, const at::Tensor& targets, int rank, int of) {
  const int64_t per = ids.size(0) / of;
  Rows r{ids.narrow(0, rank * per, per), pos.narrow(0, rank * per, per), targets.narrow(0, rank * per, per), {}};
  r.valid = r.targets.ge(0).to(at::kFloat);
  return r;
}

// Seeded whole weights of shape `c`, loaded into a split model (its
// LoadFromFull): the full weights exist once, transiently, as a checkpoint
// load would bring them: built, sliced, dropped.
template <typename Split>
absl::Status LoadSeededWeights(const actor::ModelConfig& c, Split& model) {
  at::manual_seed(1);
  actor::Transformer full(c);
  return model.LoadFromFull(full->NamedParameters());
}

// Token-mean negative log-likelihood over the scored tokens.
at::Tensor MeanNll(const actor::TokenLogProbsOutput& out, const at::Tensor& valid) {
  return -(out.logprobs * valid).sum() / valid.sum();
}

// Runs warmup + steps calls of `step` (one training step, returning its
// loss), timing each; the first step's loss goes to *first_loss and the
// timed steps' seconds to *seconds.
absl::Status TimeSteps(int warmup, int steps, double* first_loss, std::vector<double>* seconds,
                       const std::function<absl::StatusOr<at::Tensor>()>& step) {
  for (int i = 0; i < warmup + steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<at::Tensor> loss = step();
    if (!loss.ok()) return loss.status();
    if (i == 0) *first_loss = loss->item<double>();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) seconds->push_back(s);
  }
  return absl::OkStatus();
}

// Long because: a benchmark script: setup, then each measurement run and printed in order.
int Main() {
  at::set_num_threads(absl::GetFlag(FLAGS_threads));
  const int tp = absl::GetFlag(FLAGS_tp), rank = absl::GetFlag(FLAGS_rank);
  // LibTorch's own start-up memory, before any model exists.
  [[maybe_unused]] at::Tensor warm = at::randn({64, 64}).matmul(at::randn({64, 64}));
  const double rss_before = RssBytes();

  actor::ModelConfig c;
  c.hidden_size = absl::GetFlag(FLAGS_hidden);
  c.num_layers = absl::GetFlag(FLAGS_layers);
  c.num_heads = absl::GetFlag(FLAGS_heads);
  c.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  c.intermediate_size = absl::GetFlag(FLAGS_intermediate);
  c.vocab_size = absl::GetFlag(FLAGS_vocab);
  c.max_positions = absl::GetFlag(FLAGS_seq);

  const int zero3 = absl::GetFlag(FLAGS_zero3_dp), ep = absl::GetFlag(FLAGS_ep);
  const int ranks = ep > 0 ? ep : zero3 > 0 ? zero3 : tp;
  if (ep > 0) {
    c.arch = "qwen3_moe";
    c.num_experts = absl::GetFlag(FLAGS_experts);
    c.num_experts_per_tok = absl::GetFlag(FLAGS_experts_per_tok);
    c.moe_intermediate_size = absl::GetFlag(FLAGS_moe_intermediate);
    c.norm_topk_prob = true;
  }
  c10::intrusive_ptr<c10d::Backend> group;
  if (ranks > 1) {
    auto store = dist::MakeFileStore(absl::GetFlag(FLAGS_store), ranks);
    if (!store.ok()) return Fail(store.status());
    auto g = dist::CreateGlooGroup(*store, rank, ranks);
    if (!g.ok()) return Fail(g.status());
    group = *g;
  }
  at::manual_seed(2);
  const int64_t B = absl::GetFlag(FLAGS_batch), T = absl::GetFlag(FLAGS_seq);
  at::Tensor ids = at::randint(0, c.vocab_size, {B, T}, at::kLong);
  at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0).expand({B, T}).contiguous();
  at::Tensor targets = at::full({B, T}, -1, at::kLong);
  targets.narrow(1, 0, T - 1).copy_(ids.narrow(1, 1, T - 1));

  std::vector<double> seconds;
  double first_loss = 0;
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  double rss_setup = 0;
  int64_t local_params = 0;
  TensorParallelOptions options;
  options.sequence_parallel = absl::GetFlag(FLAGS_sp);
  if (ep > 0) {
    ExpertParallelOptions eo;
    eo.grad_clip = 1.0;
    auto model = ExpertParallelModel::Create(c, group, eo);
    if (!model.ok()) return Fail(model.status());
    if (absl::Status s = LoadSeededWeights(c, **model); !s.ok()) return Fail(s);
    malloc_trim(0);
    rss_setup = RssBytes();
    for (const auto& [name, p] : (*model)->NamedParameters()) local_params += p.numel();
    const Rows mine = RowsOf(ids, pos, targets, rank, ep);
    absl::Status s = TimeSteps(warmup, steps, &first_loss, &seconds, [&]() -> absl::StatusOr<at::Tensor> {
      (*model)->ZeroGrad();
      absl::Status prepared = (*model)->PrepareBackward(mine.valid.sum().item<double>());
      if (!prepared.ok()) return prepared;
      auto out = actor::TokenLogProbs((*model)->model(), mine.ids, mine.pos, mine.targets, /*chunk_size=*/64);
      if (!out.ok()) return out.status();
      at::Tensor loss = MeanNll(*out, mine.valid);
      loss.backward();
      auto stats = (*model)->Step(1e-4);
      if (!stats.ok()) return stats.status();
      return loss;
    });
    if (!s.ok()) return Fail(s);
  } else if (zero3 > 0) {
    FullyShardedOptions fo;
    fo.prefetch = absl::GetFlag(FLAGS_prefetch);
    fo.optimizer.grad_clip = 1.0;
    at::manual_seed(1);
    auto model = FullyShardedModel::Create(c, group, fo);
    if (!model.ok()) return Fail(model.status());
    malloc_trim(0);
    rss_setup = RssBytes();
    local_params = (*model)->shard_numel();
    const Rows mine = RowsOf(ids, pos, targets, rank, zero3);
    absl::Status s = TimeSteps(warmup, steps, &first_loss, &seconds, [&]() -> absl::StatusOr<at::Tensor> {
      (*model)->ZeroGrad(mine.valid.sum().item<double>());
      auto out = (*model)->TokenLogProbs(mine.ids, mine.pos, mine.targets);
      if (!out.ok()) return out.status();
      at::Tensor loss = MeanNll(*out, mine.valid);
      loss.backward();
      auto stats = (*model)->Step(1e-4);
      if (!stats.ok()) return stats.status();
      return loss;
    });
    if (!s.ok()) return Fail(s);
  } else {
    auto model = TensorParallelModel::Create(c, group, options);
    if (!model.ok()) return Fail(model.status());
    if (absl::Status s = LoadSeededWeights(c, **model); !s.ok()) return Fail(s);
    DataParallelOptions o;
    o.grad_clip = 1.0;
    o.norm_groups = {group};
    o.norm_weights = (*model)->NormWeights();
    auto dp = DataParallel::Create(nullptr, (*model)->Parameters(), o);
    if (!dp.ok()) return Fail(dp.status());
    // The training state is in place once DataParallel exists (its flat
    // buffers and AdamW moments are allocated by Create); gradients come with
    // the first backward.
    // malloc_trim hands the dropped full weights back to the system first.
    malloc_trim(0);
    rss_setup = RssBytes();
    for (const at::Tensor& p : (*model)->Parameters()) local_params += p.numel();

    // Every TP rank runs the whole batch.
    const Rows all = RowsOf(ids, pos, targets, 0, 1);
    absl::Status s = TimeSteps(warmup, steps, &first_loss, &seconds, [&]() -> absl::StatusOr<at::Tensor> {
      (*dp)->ZeroGrad();
      auto out = (*model)->TokenLogProbs(all.ids, all.pos, all.targets);
      if (!out.ok()) return out.status();
      at::Tensor loss = MeanNll(*out, all.valid);
      loss.backward();
      auto stats = (*dp)->Step(1.0, 1e-4);
      if (!stats.ok()) return stats.status();
      return loss;
    });
    if (!s.ok()) return Fail(s);
  }
  std::string line = absl::StrCat(
      "{\"tp\": ", tp, ", \"zero3_dp\": ", zero3, ", \"ep\": ", ep, ", \"sp\": ", options.sequence_parallel ? "true" : "false",
      ", \"rank\": ", rank,
      ", \"threads\": ", absl::GetFlag(FLAGS_threads), ", \"seconds\": [", absl::StrJoin(seconds, ", "),
      "], \"first_loss\": ", absl::StrFormat("%.9g", first_loss), ", \"rss_before\": ", rss_before,
      ", \"rss_setup\": ", rss_setup, ", \"peak_rss\": ", PeakRssBytes(), ", \"local_params\": ", local_params, "}\n");
  std::ofstream(absl::GetFlag(FLAGS_out)) << line;
  std::fputs(line.c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace rlmesh::learner

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return rlmesh::learner::Main();
}
