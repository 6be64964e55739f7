// Pipeline parallelism's idle time (learner/pipeline_parallel) against the
// schedules' theory, side by side with one process on the same work.
//
// A Llama of `--layers` decoder layers split evenly over P = `--stages`
// stages (threads in one process, each with one intra-op thread and its
// own end of a Gloo group over loopback TCP), each stage holding V of the
// P x V chunks (V = 1: the 1F1B schedule; V > 1: the interleaved one),
// trains one mini-batch of M micro-batches of `--rows` x `--tokens` tokens.
// Each stage records the seconds it waited for the others (its receives and
// the end of its sends) and its whole time; the measured bubble is
// waiting / total, averaged over the stages, against the theory
// (P - 1) / (V M + P - 1) for equal stages and the bubble of
// parallel/pipeline_schedule's simulation (forward 1, backward 2 time
// units). One process runs the same M forward and backward passes of the
// whole model on one thread as the reference. The (M, V) runs and the
// reference alternate within every repeat (the order reversed on odd
// repeats); the report gives medians and min-max over repeats.
//
//   bazel run -c opt //bench:pipeline_bench -- --microbatches=2,8 --virtual_stages=1,2 --repeats=5
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "actor/logprobs.h"
#include "actor/threads.h"
#include "actor/transformer.h"
#include "bench/small_llama.h"
#include "dist/gloo.h"
#include "learner/pipeline_parallel.h"
#include "parallel/pipeline_schedule.h"

ABSL_FLAG(std::string, microbatches, "2,8", "micro-batches per mini-batch to try");
ABSL_FLAG(int, repeats, 5, "repeats of every configuration");
ABSL_FLAG(int, stages, 2, "pipeline stages (threads; more than the cores share them)");
ABSL_FLAG(int, rows, 4, "rows per micro-batch");
ABSL_FLAG(int, tokens, 128, "tokens per row");
ABSL_FLAG(int, hidden, 256, "hidden size");
ABSL_FLAG(int, layers, 4, "decoder layers (split evenly over stages x virtual stages)");
ABSL_FLAG(std::string, virtual_stages, "1", "model chunks per stage to try (1 = 1F1B, > 1 = interleaved)");
ABSL_FLAG(int, vocab, 512, "vocabulary size");

namespace rlmesh {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::vector<learner::PipelineMicroBatch> MicroBatches(int m, int rows, int tokens, int vocab) {
  std::vector<learner::PipelineMicroBatch> out;
  for (int k = 0; k < m; ++k) {
    at::Tensor ids = at::randint(0, vocab, {rows, tokens}, at::kLong);
    at::Tensor pos = at::arange(tokens, at::kLong).unsqueeze(0).expand({rows, tokens}).contiguous();
    at::Tensor targets = at::full({rows, tokens}, -1, at::kLong);
    targets.narrow(1, 0, tokens - 1).copy_(ids.narrow(1, 1, tokens - 1));
    out.push_back({ids, pos, targets, {}});
  }
  return out;
}

at::Tensor Loss(const actor::TokenLogProbsOutput& out) { return -out.logprobs.mean(); }

struct PipelineRun {
  double wall = 0, bubble = 0;
};

// Positive integers from a comma-separated flag, or empty after printing
// what is wrong.
std::vector<int> PositiveList(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(text, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1) {
      std::fprintf(stderr, "--%s: \"%s\" is not a positive integer\n", flag.c_str(), std::string(s).c_str());
      return {};
    }
    out.push_back(n);
  }
  return out;
}

// P stages of `c`, chunks of equal layers, each stage V of them, on their
// own Gloo group; empty after printing the error.
std::vector<std::unique_ptr<learner::PipelineModel>> MakeStages(const actor::ModelConfig& c, int P, int V,
                                                                const learner::PipelineModel::Named& init) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<learner::PipelineModel>> stages(P);
  std::vector<std::future<absl::Status>> made;
  for (int s = 0; s < P; ++s) {
    made.push_back(std::async(std::launch::async, [&, s]() -> absl::Status {
      auto g = dist::CreateGlooGroup(store, s, P, {});
      if (!g.ok()) return g.status();
      learner::PipelineOptions o;
      o.virtual_stages = V;
      o.stage_layers.assign(P * V, c.num_layers / (P * V));
      auto m = learner::PipelineModel::Create(c, *g, o);
      if (!m.ok()) return m.status();
      stages[s] = *std::move(m);
      return stages[s]->LoadFromFull(init);
    }));
  }
  bool ok = true;
  for (auto& f : made) {
    const absl::Status st = f.get();
    if (!st.ok()) {
      std::fprintf(stderr, "stage: %s\n", st.ToString().c_str());
      ok = false;
    }
  }
  if (!ok) stages.clear();
  return stages;
}

// Long because: the setup, the alternated repeats and the table, one
// benchmark read top to bottom.
int Main() {
  actor::ConfigureThreads(1);
  const std::vector<int> ms = PositiveList("microbatches", absl::GetFlag(FLAGS_microbatches));
  const std::vector<int> vs = PositiveList("virtual_stages", absl::GetFlag(FLAGS_virtual_stages));
  if (ms.empty() || vs.empty()) return 2;
  const int rows = absl::GetFlag(FLAGS_rows), tokens = absl::GetFlag(FLAGS_tokens);
  const actor::ModelConfig c =
      bench::SmallLlama(absl::GetFlag(FLAGS_vocab), absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_layers), tokens);
  at::manual_seed(1);
  actor::Transformer whole(c);
  const auto init = whole->NamedParameters();

  const int P = absl::GetFlag(FLAGS_stages);
  std::map<int, std::vector<std::unique_ptr<learner::PipelineModel>>> by_v;
  for (int v : vs) {
    if (P < 2 || c.num_layers % (P * v) != 0) {
      std::fprintf(stderr, "--stages x --virtual_stages: must be >= 2 and divide --layers\n");
      return 2;
    }
    by_v[v] = MakeStages(c, P, v, init);
    if (by_v[v].empty()) return 1;
  }
  auto run_pipeline = [&](int v, const std::vector<learner::PipelineMicroBatch>& micro) -> PipelineRun {
    std::vector<learner::PipelineTrace> traces(P);
    std::vector<std::future<absl::Status>> done;
    const auto t = Clock::now();
    for (int s = 0; s < P; ++s) {
      done.push_back(std::async(std::launch::async, [&, s] {
        by_v[v][s]->ZeroGrad();
        return by_v[v][s]->Train(
            micro, 1.0, [](size_t, const actor::TokenLogProbsOutput& out) { return Loss(out); }, &traces[s]);
      }));
    }
    for (auto& f : done) {
      const absl::Status st = f.get();
      if (!st.ok()) std::fprintf(stderr, "train: %s\n", st.ToString().c_str());
    }
    PipelineRun r;
    r.wall = Since(t);
    for (const auto& tr : traces) r.bubble += tr.wait_seconds / tr.total_seconds / P;
    return r;
  };
  auto run_single = [&](const std::vector<learner::PipelineMicroBatch>& micro) {
    const auto t = Clock::now();
    whole->zero_grad();
    for (const auto& mb : micro) {
      auto out = actor::TokenLogProbs(whole, mb.ids, mb.positions, mb.targets, 128);
      Loss(*out).backward();
    }
    return Since(t);
  };

  // Keyed by (M, V); V = 0 is the one-process reference.
  std::map<std::pair<int, int>, std::vector<double>> bubble, wall;
  std::map<int, std::vector<learner::PipelineMicroBatch>> inputs;
  std::vector<std::pair<int, int>> runs;
  for (int m : ms) {
    inputs[m] = MicroBatches(m, rows, tokens, c.vocab_size);
    for (int v : vs) runs.emplace_back(m, v);
    runs.emplace_back(m, 0);
  }
  for (auto [m, v] : runs) {
    if (v > 0) run_pipeline(v, inputs[m]);  // warm-up
  }
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    std::vector<std::pair<int, int>> order = runs;
    if (rep % 2) std::reverse(order.begin(), order.end());
    for (auto [m, v] : order) {
      if (v == 0) {
        wall[{m, 0}].push_back(run_single(inputs[m]));
        continue;
      }
      const PipelineRun r = run_pipeline(v, inputs[m]);
      bubble[{m, v}].push_back(r.bubble);
      wall[{m, v}].push_back(r.wall);
    }
  }
  std::printf("P=%d, %d layers (hidden %d, vocab %d), micro-batches of %d x %d tokens, %d repeats\n", P,
              static_cast<int>(c.num_layers), static_cast<int>(c.hidden_size), static_cast<int>(c.vocab_size),
              static_cast<int>(rows), static_cast<int>(tokens), absl::GetFlag(FLAGS_repeats));
  std::printf("| M | V | bubble, theory | bubble, simulated | bubble, measured (median, min-max) | pipeline step s | "
              "one process s | one process / pipeline |\n|---|---|---|---|---|---|---|---|\n");
  for (int m : ms) {
    for (int v : vs) {
      const std::vector<double>& b = bubble[{m, v}];
      const auto [blo, bhi] = std::minmax_element(b.begin(), b.end());
      auto sim = parallel::SimulatePipeline(P, v, m);
      const double one = Median(wall[{m, 0}]), step = Median(wall[{m, v}]);
      std::printf("| %d | %d | %.3f | %.3f | %.3f (%.3f-%.3f) | %.3f | %.3f | %.2f |\n", m, v,
                  parallel::TheoreticalBubble(P, v, m), sim.ok() ? sim->bubble : -1.0, Median(b), *blo, *bhi, step,
                  one, one / step);
    }
  }
  return 0;
}

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return rlmesh::Main();
}
