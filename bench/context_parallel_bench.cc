// One rank of a context-parallel training step (learner/context_parallel),
// or one process with the whole sequence (--world=1, the reference), on one
// row of --tokens tokens (one sequence, or with --packed_docs documents
// packed under their segment ids; with --checkpoint every layer
// activation-checkpointed): the step's activation memory and time. Started
// per layout by bench/context_parallel.py; report bench/context_parallel.md.
//
// A warm-up step allocates the gradients (zeroed in place after it, not
// freed), so the measured step's peak resident set above the resident set
// before it is the activations (and the step's transient buffers: the
// gathered keys and values of one layer, a chunk of logits), not the
// gradients every layout holds alike.
//
//   bazel-bin/bench/context_parallel_bench --world=2 --rank=0 --store=/tmp/s --tokens=4096
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "actor/logprobs.h"
#include "actor/threads.h"
#include "actor/transformer.h"
#include "bench/process_memory.h"
#include "bench/small_llama.h"
#include "dist/gloo.h"
#include "dist/store.h"
#include "learner/context_parallel.h"

ABSL_FLAG(int, world, 1, "context-parallel ranks (1: one process, the plain model)");
ABSL_FLAG(int, rank, 0, "this rank");
ABSL_FLAG(std::string, store, "", "file store path shared by the ranks (world > 1)");
ABSL_FLAG(int, tokens, 4096, "tokens in the row");
ABSL_FLAG(int, hidden, 256, "hidden size");
ABSL_FLAG(int, layers, 4, "decoder layers");
ABSL_FLAG(int, vocab, 512, "vocabulary size");
ABSL_FLAG(std::string, kv_exchange, "ring", "how keys and values travel (world > 1): ring or collectives");
ABSL_FLAG(int, packed_docs, 0,
          "> 0: the row packs documents of this many tokens (segment ids as the attention mask, positions "
          "restarting per document); 0: one sequence, no mask");
ABSL_FLAG(bool, checkpoint, false,
          "activation checkpointing: every decoder layer keeps only its input and runs again in the backward pass");

namespace rlmesh {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int Main() {
  actor::ConfigureThreads(1);
  const int world = absl::GetFlag(FLAGS_world), rank = absl::GetFlag(FLAGS_rank);
  const int64_t T = absl::GetFlag(FLAGS_tokens);
  const actor::ModelConfig c =
      bench::SmallLlama(absl::GetFlag(FLAGS_vocab), absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_layers), T);
  at::manual_seed(1);
  at::Tensor ids = at::randint(0, c.vocab_size, {1, T}, at::kLong);
  at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0);
  at::Tensor targets = at::full({1, T}, -1, at::kLong);
  targets.narrow(1, 0, T - 1).copy_(ids.narrow(1, 1, T - 1));
  at::Tensor mask;
  if (const int64_t doc = absl::GetFlag(FLAGS_packed_docs); doc > 0) {
    const at::Tensor index = at::arange(T, at::kLong).unsqueeze(0);
    mask = index.div(doc, "floor") + 1;
    pos = index.remainder(doc);
    // No target across a document's end.
    targets.masked_fill_(pos.eq(doc - 1), -1);
  }
  const at::Tensor valid = targets.ge(0).to(at::kFloat);

  std::function<at::Tensor()> loss;
  std::vector<at::Tensor> params;
  actor::Transformer whole{nullptr};
  std::unique_ptr<learner::ContextParallelModel> cp;
  c10::intrusive_ptr<c10d::Backend> group;
  whole = actor::Transformer(c);
  whole->set_activation_checkpointing(absl::GetFlag(FLAGS_checkpoint));
  if (world == 1) {
    params = whole->parameters();
    loss = [&] {
      auto out = actor::TokenLogProbs(whole, ids, pos, targets, 128, 1.0, mask);
      return -(out->logprobs * valid).sum() / valid.sum();
    };
  } else {
    auto store = dist::MakeFileStore(absl::GetFlag(FLAGS_store), world);
    if (!store.ok()) {
      std::fprintf(stderr, "store: %s\n", store.status().ToString().c_str());
      return 1;
    }
    auto g = dist::CreateGlooGroup(*store, rank, world, {});
    if (!g.ok()) {
      std::fprintf(stderr, "group: %s\n", g.status().ToString().c_str());
      return 1;
    }
    group = *g;
    auto m = learner::ContextParallelModel::Wrap(whole, group, 128);
    if (!m.ok()) {
      std::fprintf(stderr, "model: %s\n", m.status().ToString().c_str());
      return 1;
    }
    cp = *std::move(m);
    const std::string exchange = absl::GetFlag(FLAGS_kv_exchange);
    if (exchange != "ring" && exchange != "collectives") {
      std::fprintf(stderr, "--kv_exchange: \"%s\" is not ring or collectives\n", exchange.c_str());
      return 2;
    }
    cp->set_key_value_exchange(exchange == "ring" ? learner::KeyValueExchange::kRing
                                                  : learner::KeyValueExchange::kCollectives);
    params = cp->Parameters();
    loss = [&] {
      auto out = cp->TokenLogProbs(ids, pos, targets, 1.0, mask);
      const at::Tensor mine = valid * out->mine;
      return -(out->out.logprobs * mine).sum() / valid.sum();
    };
  }
  loss().backward();  // allocates the gradients
  for (at::Tensor& p : params) p.mutable_grad().zero_();
  const double before = bench::RssBytes();
  bench::ResetPeakRss();
  const auto t = std::chrono::steady_clock::now();
  loss().backward();
  const double seconds = Since(t);
  const double peak = bench::PeakRssBytes();
  std::printf("tokens=%lld world=%d rank=%d activation_mib=%.1f step_seconds=%.3f\n", static_cast<long long>(T),
              world, rank, (peak - before) / (1 << 20), seconds);
  return 0;
}

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return rlmesh::Main();
}
