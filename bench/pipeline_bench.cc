// Pipeline parallelism's idle time (learner/pipeline_parallel) against the
// 1F1B schedule's theory, side by side with one process on the same work.
//
// A Llama of `--layers` decoder layers split evenly over P = `--stages`
// stages (threads in one process, each with one intra-op thread and its
// own end of a Gloo group over loopback TCP) trains one mini-batch of M
// micro-batches of `--rows` x `--tokens` tokens. Each stage records the
// seconds it waited for the others (its receives and the end of its sends)
// and its whole time; the measured bubble is waiting / total, averaged over
// the stages, against
// the theory (P - 1) / (M + P - 1) for equal stages. One process runs the
// same M forward and backward passes of the whole model on one thread as
// the reference. The M values and the reference alternate within every
// repeat (the order reversed on odd repeats); the report gives medians and
// min-max over repeats.
//
//   bazel run -c opt //bench:pipeline_bench -- --microbatches=2,8 --repeats=5
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

ABSL_FLAG(std::string, microbatches, "2,8", "micro-batches per mini-batch to try");
ABSL_FLAG(int, repeats, 5, "repeats of every configuration");
ABSL_FLAG(int, stages, 2, "pipeline stages (threads; more than the cores share them)");
ABSL_FLAG(int, rows, 4, "rows per micro-batch");
ABSL_FLAG(int, tokens, 128, "tokens per row");
ABSL_FLAG(int, hidden, 256, "hidden size");
ABSL_FLAG(int, layers, 4, "decoder layers (split evenly over the two stages)");
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

int Main() {
  actor::ConfigureThreads(1);
  std::vector<int> ms;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_microbatches), ',')) {
    int m = 0;
    if (!absl::SimpleAtoi(s, &m) || m < 1) {
      std::fprintf(stderr, "--microbatches: \"%s\" is not a positive integer\n", std::string(s).c_str());
      return 2;
    }
    ms.push_back(m);
  }
  const int rows = absl::GetFlag(FLAGS_rows), tokens = absl::GetFlag(FLAGS_tokens);
  const actor::ModelConfig c =
      bench::SmallLlama(absl::GetFlag(FLAGS_vocab), absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_layers), tokens);
  at::manual_seed(1);
  actor::Transformer whole(c);
  const auto init = whole->NamedParameters();

  // Two stages, their groups and models made once.
  const int P = absl::GetFlag(FLAGS_stages);
  if (P < 2 || c.num_layers % P != 0) {
    std::fprintf(stderr, "--stages: must be >= 2 and divide --layers\n");
    return 2;
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<learner::PipelineModel>> stages(P);
  {
    std::vector<std::future<absl::Status>> made;
    for (int s = 0; s < P; ++s) {
      made.push_back(std::async(std::launch::async, [&, s]() -> absl::Status {
        auto g = dist::CreateGlooGroup(store, s, P, {});
        if (!g.ok()) return g.status();
        learner::PipelineOptions o;
        o.stage_layers.assign(P, c.num_layers / P);
        auto m = learner::PipelineModel::Create(c, *g, o);
        if (!m.ok()) return m.status();
        stages[s] = *std::move(m);
        return stages[s]->LoadFromFull(init);
      }));
    }
    for (auto& f : made) {
      const absl::Status st = f.get();
      if (!st.ok()) {
        std::fprintf(stderr, "stage: %s\n", st.ToString().c_str());
        return 1;
      }
    }
  }
  auto run_pipeline = [&](const std::vector<learner::PipelineMicroBatch>& micro) -> PipelineRun {
    std::vector<learner::PipelineTrace> traces(P);
    std::vector<std::future<absl::Status>> done;
    const auto t = Clock::now();
    for (int s = 0; s < P; ++s) {
      done.push_back(std::async(std::launch::async, [&, s] {
        stages[s]->ZeroGrad();
        return stages[s]->Train(
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

  std::map<int, std::vector<double>> bubble, wall, single;
  std::map<int, std::vector<learner::PipelineMicroBatch>> inputs;
  for (int m : ms) inputs[m] = MicroBatches(m, rows, tokens, c.vocab_size);
  for (int m : ms) run_pipeline(inputs[m]);  // warm-up
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
    std::vector<int> order = ms;
    if (rep % 2) std::reverse(order.begin(), order.end());
    for (int m : order) {
      const PipelineRun r = run_pipeline(inputs[m]);
      bubble[m].push_back(r.bubble);
      wall[m].push_back(r.wall);
      single[m].push_back(run_single(inputs[m]));
    }
  }
  std::printf("P=%d, %d layers (hidden %d, vocab %d), micro-batches of %d x %d tokens, %d repeats\n", P, c.num_layers,
              c.hidden_size, c.vocab_size, rows, tokens, absl::GetFlag(FLAGS_repeats));
  std::printf("| M | bubble, theory | bubble, measured (median, min-max) | pipeline step s | one process s | "
              "one process / pipeline |\n|---|---|---|---|---|---|\n");
  for (int m : ms) {
    const auto [blo, bhi] = std::minmax_element(bubble[m].begin(), bubble[m].end());
    std::printf("| %d | %.3f | %.3f (%.3f-%.3f) | %.3f | %.3f | %.2f |\n", m, (P - 1.0) / (m + P - 1),
                Median(bubble[m]), *blo,
                *bhi, Median(wall[m]), Median(single[m]), Median(single[m]) / Median(wall[m]));
  }
  return 0;
}

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return rlmesh::Main();
}
