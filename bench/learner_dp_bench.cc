// Data-parallel overhead of learner/data_parallel at K = 2 against K = 1,
// side by side in one process.
//
// For a parameter set of N fp32 elements (8 tensors) with gradients already
// in place, one DataParallel::Step is timed (gradient reduction + clipping +
// AdamW + ZeRO-1 all-gather) for:
//   k1         one process, no collectives (the reference);
//   k2-dp      two ranks, bucketed all-reduce, replicated AdamW;
//   k2-zero1   two ranks, Gloo reduce_scatter, sharded AdamW, all-gather;
//   k2-zero1 rs=all-reduce      reduce-scatter emulated by all-reduce + slice;
//   k2-zero1 rs+ag=all-reduce   and the all-gather by an all-reduce too;
// and a bare all-reduce of the same N floats. The K = 2 ranks are two
// threads, each with its own Gloo group over one HashStore (Gloo still moves
// the bytes over loopback TCP). Each configuration runs `--repeats` times
// `--steps` steps after a warm-up; the report gives the median and min-max
// of the per-step time over repeats and the ratio of medians to k1.
//
//   bazel run //bench:learner_dp_bench -- --elements=4000000,16000000
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "dist/gloo.h"
#include "dist/store.h"
#include "learner/data_parallel.h"

ABSL_FLAG(std::string, elements, "1000000,4000000,16000000", "parameter counts to try");
ABSL_FLAG(int, steps, 5, "timed steps per repeat");
ABSL_FLAG(int, repeats, 5, "repeats per configuration");
ABSL_FLAG(int, threads, 2, "intra-op threads (at::set_num_threads)");

namespace rlmesh::learner {
namespace {

using Clock = std::chrono::steady_clock;

struct Summary {
  double median = 0, min = 0, max = 0;  // seconds per step
  // Mean seconds per step in each phase of DataParallel::Step (rank 0).
  double reduce = 0, update = 0, gather = 0;
};

struct RankTimes {
  std::vector<double> per_step;  // seconds per step, one per repeat
  double reduce = 0, update = 0, gather = 0;
};

Summary Summarise(const RankTimes& t) {
  std::vector<double> v = t.per_step;
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back(), t.reduce, t.update, t.gather};
}

std::vector<at::Tensor> MakeParams(int64_t n) {
  std::vector<at::Tensor> params;
  const int64_t chunk = n / 8;
  for (int i = 0; i < 8; ++i) {
    at::Tensor p = at::randn({i == 7 ? n - 7 * chunk : chunk}).requires_grad_(true);
    p.mutable_grad() = at::randn_like(p) * 1e-3;
    params.push_back(p);
  }
  return params;
}

// Seconds per step for each repeat, for one rank; `group` null = K = 1.
// mode: "step" (DataParallel::Step) or "allreduce" (bare collective).
RankTimes RunRank(c10::intrusive_ptr<c10d::Backend> group, int64_t n,
                  DataParallelOptions options, const std::string& mode) {
  RankTimes times;
  bool timing = false;
  std::vector<at::Tensor> params = MakeParams(n);
  auto dp = DataParallel::Create(group, params, options);
  if (!dp.ok()) {
    std::fprintf(stderr, "create: %s\n", dp.status().ToString().c_str());
    std::exit(1);
  }
  at::Tensor flat = at::randn({n});
  auto one = [&] {
    if (mode == "allreduce") {
      std::vector<at::Tensor> t = {flat};
      group->allreduce(t)->wait();
      return;
    }
    auto s = (*dp)->Step(1.0, 1e-4);
    if (!s.ok()) {
      std::fprintf(stderr, "step: %s\n", s.status().ToString().c_str());
      std::exit(1);
    }
    if (timing) {
      times.reduce += s->reduce_seconds;
      times.update += s->update_seconds;
      times.gather += s->gather_seconds;
    }
  };
  one();  // warm-up: buffers, connections
  timing = true;
  const int steps = absl::GetFlag(FLAGS_steps);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  for (int r = 0; r < repeats; ++r) {
    if (group) group->barrier()->wait();
    auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) one();
    times.per_step.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / steps);
  }
  times.reduce /= steps * repeats;
  times.update /= steps * repeats;
  times.gather /= steps * repeats;
  return times;
}

Summary RunK2(int64_t n, DataParallelOptions options, const std::string& mode) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<RankTimes>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(std::async(std::launch::async, [=] {
      auto group = dist::CreateGlooGroup(store, rank, 2);
      if (!group.ok()) {
        std::fprintf(stderr, "group: %s\n", group.status().ToString().c_str());
        std::exit(1);
      }
      return RunRank(*group, n, options, mode);
    }));
  }
  // A step is as slow as its slower rank.
  RankTimes a = ranks[0].get(), b = ranks[1].get();
  for (size_t i = 0; i < a.per_step.size(); ++i) {
    a.per_step[i] = std::max(a.per_step[i], b.per_step[i]);
  }
  return Summarise(a);
}

void Row(const char* name, int64_t n, const Summary& s, double reference) {
  std::printf("| %s | %.1f | %.2f | %.2f–%.2f | %.2f | %.1f / %.1f / %.1f |\n", name,
              static_cast<double>(n) * 4 / (1 << 20), s.median * 1e3, s.min * 1e3, s.max * 1e3,
              s.median / reference, s.reduce * 1e3, s.update * 1e3, s.gather * 1e3);
}

}  // namespace
}  // namespace rlmesh::learner

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace rlmesh::learner;
  at::set_num_threads(absl::GetFlag(FLAGS_threads));
  at::manual_seed(0);
  std::printf("steps=%d repeats=%d intra-op threads=%d; times per step in ms\n\n",
              absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_repeats),
              absl::GetFlag(FLAGS_threads));
  std::printf(
      "| config | MiB | median ms/step | min–max ms | × k1 | reduce / update / gather ms "
      "(rank 0 mean) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (absl::string_view e : absl::StrSplit(absl::GetFlag(FLAGS_elements), ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(e, &n) || n < 8) {
      std::fprintf(stderr, "bad --elements entry %s\n", std::string(e).c_str());
      return 2;
    }
    DataParallelOptions dp;
    dp.grad_clip = 1.0;
    const Summary k1 = Summarise(RunRank(nullptr, n, dp, "step"));
    Row("k1", n, k1, k1.median);
    Row("k2-dp", n, RunK2(n, dp, "step"), k1.median);
    DataParallelOptions z = dp;
    z.zero1 = true;
    Row("k2-zero1", n, RunK2(n, z, "step"), k1.median);
    z.emulate_reduce_scatter = true;
    Row("k2-zero1 rs=all-reduce", n, RunK2(n, z, "step"), k1.median);
    z.emulate_all_gather = true;
    Row("k2-zero1 rs+ag=all-reduce", n, RunK2(n, z, "step"), k1.median);
    Row("k2-allreduce only", n, RunK2(n, dp, "allreduce"), k1.median);
  }
  return 0;
}
