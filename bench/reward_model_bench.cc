// Reward-model scoring throughput (not a test). Report: bench/reward_server.md.
//
// The same seeded model, loaded twice in one process: once with the dynamic
// batcher (max_batch, max_wait) and once with max_batch = 1 (one request at a
// time, the reference). `clients` threads each send single-item Score calls
// with distinct items (cache off, so every item runs the model). The two
// sides alternate within each repeat; the ratio is taken per repeat.
//
//   bazel run -c opt //bench:reward_model_bench -- [--repeats=5] [--clients=16]
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "actor/checkpoint.h"
#include "actor/transformer.h"
#include "reward_server/reward_model.h"

ABSL_FLAG(int, repeats, 5, "Repeats of each measurement.");
ABSL_FLAG(int, threads, 2, "LibTorch intra-op threads.");
ABSL_FLAG(int, clients, 16, "Concurrent callers, one item per call.");
ABSL_FLAG(int, items, 512, "Items per side per repeat (spread over the callers).");
ABSL_FLAG(int, hidden, 256, "Model width.");
ABSL_FLAG(int, layers, 4, "Decoder layers.");
ABSL_FLAG(int, max_batch, 32, "Batched side: most items in one forward pass.");
ABSL_FLAG(bool, short_items, false, "Prompts of 2-6 and completions of 1-4 tokens instead of 16-32 and 8-64.");
ABSL_FLAG(double, max_wait_ms, 5.0, "Batched side: longest wait for a fuller batch, ms.");

namespace rlmesh {
namespace {

struct Stats {
  double median, min, max;
};
Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// Items/s for `items` scored by `clients` threads, one item per call.
double Run(RewardModel& rm, const std::vector<RewardModelItem>& items, int clients) {
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      for (size_t i = c; i < items.size(); i += clients) {
        auto s = rm.Score({items[i]});
        if (!s.ok()) {
          std::fprintf(stderr, "score failed: %s\n", s.status().ToString().c_str());
          std::exit(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return static_cast<double>(items.size()) / absl::ToDoubleSeconds(absl::Now() - start);
}

int Main() {
  actor::ConfigureThreads(absl::GetFlag(FLAGS_threads));
  actor::ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = absl::GetFlag(FLAGS_hidden);
  c.intermediate_size = actor::DefaultIntermediateSize(c.hidden_size);
  c.num_layers = absl::GetFlag(FLAGS_layers);
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 256;
  c.value_head = true;
  at::manual_seed(1);
  actor::Transformer model(c);
  char tmpl[] = "/tmp/rm_bench_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  if (auto s = actor::SaveHfModel(model, dir); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }

  RewardModelOptions batched;
  batched.max_batch = absl::GetFlag(FLAGS_max_batch);
  batched.max_wait = absl::Microseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_max_wait_ms) * 1000));
  batched.cache_size = 0;
  batched.threads = absl::GetFlag(FLAGS_threads);
  RewardModelOptions single = batched;
  single.max_batch = 1;
  single.max_wait = absl::ZeroDuration();
  auto rm_b = RewardModel::Load(dir, batched);
  auto rm_s = RewardModel::Load(dir, single);
  if (!rm_b.ok() || !rm_s.ok()) {
    std::fprintf(stderr, "load failed\n");
    return 1;
  }

  // Prompt 16-32 tokens, completion 8-64 tokens, seeded; distinct per repeat.
  std::mt19937 rng(1234);
  auto make_items = [&](int n) {
    std::vector<RewardModelItem> v(n);
    for (auto& it : v) {
      const bool short_items = absl::GetFlag(FLAGS_short_items);
      it.prompt_ids.resize(std::uniform_int_distribution<int>(short_items ? 2 : 16, short_items ? 6 : 32)(rng));
      it.completion_ids.resize(std::uniform_int_distribution<int>(short_items ? 1 : 8, short_items ? 4 : 64)(rng));
      for (int& id : it.prompt_ids) id = std::uniform_int_distribution<int>(1, 63)(rng);
      for (int& id : it.completion_ids) id = std::uniform_int_distribution<int>(1, 63)(rng);
    }
    return v;
  };
  const int clients = absl::GetFlag(FLAGS_clients);
  const int n = absl::GetFlag(FLAGS_items);
  Run(**rm_b, make_items(64), clients);  // warm-up
  Run(**rm_s, make_items(64), clients);
  std::vector<double> tb, ts, ratio;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    const auto items = make_items(n);
    // Alternate which side goes first.
    double b, s;
    if (r % 2 == 0) {
      b = Run(**rm_b, items, clients);
      s = Run(**rm_s, items, clients);
    } else {
      s = Run(**rm_s, items, clients);
      b = Run(**rm_b, items, clients);
    }
    tb.push_back(b);
    ts.push_back(s);
    ratio.push_back(b / s);
    std::printf("repeat %d: batched %.1f items/s, one-at-a-time %.1f items/s, ratio %.2f\n", r, b, s, b / s);
  }
  const Stats B = Summarize(tb), S = Summarize(ts), R = Summarize(ratio);
  std::printf("\n%s items, model hidden=%d layers=%d, %d clients, %d items/repeat, threads=%d, max_batch=%d max_wait=%.1fms\n",
              absl::GetFlag(FLAGS_short_items) ? "short (3-10 token)" : "long (24-96 token)", static_cast<int>(c.hidden_size),
              static_cast<int>(c.num_layers), clients, n, absl::GetFlag(FLAGS_threads), batched.max_batch,
              absl::GetFlag(FLAGS_max_wait_ms));
  std::printf("| side | items/s median | min | max |\n|---|---|---|---|\n");
  std::printf("| dynamic batching | %.1f | %.1f | %.1f |\n", B.median, B.min, B.max);
  std::printf("| one at a time (max_batch=1) | %.1f | %.1f | %.1f |\n", S.median, S.min, S.max);
  std::printf("| ratio (per repeat) | %.2f | %.2f | %.2f |\n", R.median, R.min, R.max);
  const RewardModelStats st = (*rm_b)->stats();
  std::printf("batched side, incl. warm-up: mean batch size %.2f, %.2f forward passes per batch\n",
              st.mean_batch_size(), static_cast<double>(st.passes) / std::max<int64_t>(1, st.batches));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return rlmesh::Main();
}
