// Continuous-batching generation with long-tailed completion lengths (not a
// test). Report: bench/rollout.md ("KV cache in place"); driver:
// bench/generate_ab.py, which runs this binary built at two commits side by
// side.
//
// A random Llama (workload (b)'s shape by default) generates for --requests
// prompts of --prompt_len tokens, one sample each, greedy. Each request's
// max_new_tokens is drawn from an exponential distribution of mean
// --mean_new, clipped to [1, --max_new]: most completions are short and a
// few are long, as in RL rollouts, so rows finish at different steps and
// new requests join the running batch (max_batch rows at most).
//
// Prints one JSON line: seconds per repeat, generated tokens, and memory:
// the resident set before the model existed, after it was built, and the
// peak; the weights' bytes; and the KV cache's theory for max_batch rows of
// (prompt_len + max_new) positions.
//
// --tp N > 1 generates with rollout::TensorParallelEngine instead: N rank
// threads of --threads / N intra-op threads each, the whole model dropped
// once they hold their slices. It adds each rank's parameter bytes
// (`rank_weight_bytes`) and its KV-cache theory (1/N of the KV heads).
// The ranks share one process, so the resident set is their sum.
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "actor/generate.h"
#include "actor/transformer.h"
#include "bench/process_memory.h"
#include "rollout/tp_engine.h"

ABSL_FLAG(int, hidden, 512, "Hidden size.");
ABSL_FLAG(int, layers, 8, "Decoder layers.");
ABSL_FLAG(int, heads, 8, "Attention heads.");
ABSL_FLAG(int, kv_heads, 4, "Key/value heads.");
ABSL_FLAG(int, intermediate, 1408, "MLP width.");
ABSL_FLAG(int, vocab, 32000, "Vocabulary size.");
ABSL_FLAG(int, requests, 128, "Prompts, one sample each.");
ABSL_FLAG(int, prompt_len, 32, "Prompt tokens.");
ABSL_FLAG(double, mean_new, 48, "Mean of the exponential completion length.");
ABSL_FLAG(int, max_new, 256, "Longest completion.");
ABSL_FLAG(int, max_batch, 64, "GeneratorOptions.max_batch.");
ABSL_FLAG(int, threads, 2, "LibTorch intra-op threads.");
ABSL_FLAG(int, repeats, 3, "Timed generations (one untimed first).");
ABSL_FLAG(int, seed, 1, "Seed of the lengths and the weights.");
ABSL_FLAG(int, tp, 1, "Tensor-parallel rank threads (rollout::TensorParallelEngine); 1 = one Generator.");

namespace rlmesh::actor {
namespace {

using bench::PeakRssBytes;
using bench::RssBytes;

int Main() {
  const int tp = absl::GetFlag(FLAGS_tp);
  // The ranks share the cores: each runs its own intra-op pool.
  at::set_num_threads(std::max(1, absl::GetFlag(FLAGS_threads) / tp));
  [[maybe_unused]] at::Tensor warm = at::randn({64, 64}).matmul(at::randn({64, 64}));
  const double rss_before = RssBytes();
  ModelConfig c;
  c.arch = "llama";
  c.hidden_size = absl::GetFlag(FLAGS_hidden);
  c.num_layers = absl::GetFlag(FLAGS_layers);
  c.num_heads = absl::GetFlag(FLAGS_heads);
  c.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  c.intermediate_size = absl::GetFlag(FLAGS_intermediate);
  c.vocab_size = absl::GetFlag(FLAGS_vocab);
  const int prompt_len = absl::GetFlag(FLAGS_prompt_len), max_new = absl::GetFlag(FLAGS_max_new);
  c.max_positions = prompt_len + max_new;
  torch::manual_seed(absl::GetFlag(FLAGS_seed));
  Transformer model(c);
  model->eval();
  double weight_bytes = 0;
  for (const auto& p : model->parameters()) weight_bytes += static_cast<double>(p.numel() * p.element_size());
  const double rss_model = RssBytes();

  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::exponential_distribution<double> length(1.0 / absl::GetFlag(FLAGS_mean_new));
  std::uniform_int_distribution<int64_t> token(0, c.vocab_size - 1);
  std::vector<GenerationRequest> requests;
  int64_t want_tokens = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_requests); ++i) {
    GenerationRequest r;
    r.id = static_cast<uint64_t>(i);
    for (int t = 0; t < prompt_len; ++t) r.prompt.push_back(token(rng));
    r.sampling.greedy = true;
    r.sampling.max_new_tokens = std::clamp(static_cast<int>(std::ceil(length(rng))), 1, max_new);
    want_tokens += r.sampling.max_new_tokens;
    requests.push_back(std::move(r));
  }

  GeneratorOptions options;
  options.max_batch = absl::GetFlag(FLAGS_max_batch);
  std::unique_ptr<rollout::TensorParallelEngine> engine;
  std::vector<int64_t> rank_bytes;
  if (tp > 1) {
    rollout::TensorParallelEngineOptions o;
    o.tp = tp;
    o.generator = options;
    auto e = rollout::TensorParallelEngine::Create(c, o);
    absl::Status s = e.ok() ? (*e)->Load(model->NamedParameters()) : e.status();
    if (!s.ok()) {
      std::fprintf(stderr, "generate_bench: %s\n", s.ToString().c_str());
      return 1;
    }
    engine = std::move(*e);
    for (int r = 0; r < tp; ++r) rank_bytes.push_back(engine->ParameterBytes(r));
    model = nullptr;  // only the slices remain
  }
  std::vector<double> seconds;
  int64_t tokens = 0;
  for (int rep = 0; rep <= absl::GetFlag(FLAGS_repeats); ++rep) {
    std::unique_ptr<Generator> whole;
    if (!engine) whole = std::make_unique<Generator>(model, options);
    GenerationEngine& gen = engine ? static_cast<GenerationEngine&>(*engine) : *whole;
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status status;
    tokens = 0;
    for (const auto& r : requests) {
      status.Update(gen.Submit(r));
    }
    while (status.ok() && !gen.Idle()) {
      status.Update(gen.Step([&](GroupResult g) { tokens += static_cast<int64_t>(g.samples[0].tokens.size()); }));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!status.ok()) {
      std::fprintf(stderr, "generate_bench: %s\n", status.ToString().c_str());
      return 1;
    }
    if (tokens != want_tokens) {
      std::fprintf(stderr, "generate_bench: %lld tokens, expected %lld\n", static_cast<long long>(tokens),
                   static_cast<long long>(want_tokens));
      return 1;
    }
    if (rep > 0) seconds.push_back(s);
  }
  // Keys and values, fp32, for max_batch rows of the longest sequence.
  const double kv_theory = 2.0 * c.num_layers * c.num_kv_heads * c.HeadDim() * 4.0 * options.max_batch *
                           static_cast<double>(c.max_positions);
  std::printf("%s\n",
              absl::StrCat("{\"tp\": ", tp, ", \"seconds\": [", absl::StrJoin(seconds, ", "), "], \"tokens\": ", tokens,
                           ", \"rss_before\": ", rss_before, ", \"rss_model\": ", rss_model,
                           ", \"peak_rss\": ", PeakRssBytes(), ", \"weight_bytes\": ", weight_bytes,
                           ", \"kv_theory_bytes\": ", kv_theory, ", \"rank_weight_bytes\": [",
                           absl::StrJoin(rank_bytes, ", "), "], \"rank_kv_theory_bytes\": ", kv_theory / tp, "}")
                  .c_str());
  return 0;
}

}  // namespace
}  // namespace rlmesh::actor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return rlmesh::actor::Main();
}
