#pragma once

// Helpers for the trainer tests: the tiny experiment they train (a 2-layer,
// hidden-32 model with the char tokenizer on 1-digit arithmetic, `train`
// examples, 4 held out; dozens of steps take seconds), and K trainers run
// as the ranks of one data-parallel group.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "actor/safetensors.h"
#include "learner/trainer.h"
#include "proto/config.pb.h"

namespace rlmesh::learner::testing {

inline ExperimentConfig TinyExperiment(uint64_t seed, int64_t train) {
  ExperimentConfig e;
  e.set_name("tiny");
  e.set_seed(seed);
  auto* m = e.mutable_model();
  m->set_hidden(32);
  m->set_layers(2);
  m->set_heads(2);
  m->set_max_positions(32);
  auto* t = e.mutable_task();
  t->set_kind("arithmetic");
  t->set_digits(1);
  t->set_train(train);
  t->set_eval(4);
  return e;
}

// Runs ranks[0..world) as one group over a FileStore at `store_path`, a
// thread each: Configure(`base` with rank, world size and store), `steps`
// TrainSteps from `step(i)`, then `after(rank, trainer)` when given (calls
// such as Save that need every rank at once). With `gather` (the default),
// when every rank got that far, they all GatherPolicy, so that rank 0's
// PolicyParameters() is the whole policy whatever the layout. Returns each
// rank's first error, or OK.
inline std::vector<absl::Status> TrainShards(Trainer* ranks, int world, const ConfigureRequest& base,
                                             const std::string& store_path, int steps,
                                             const std::function<TrainStepRequest(int)>& step,
                                             const std::function<absl::Status(int, Trainer&)>& after = nullptr,
                                             bool gather = true) {
  std::vector<absl::Status> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ConfigureRequest req = base;
      req.set_rank(r);
      req.set_world_size(world);
      req.set_store_address("file:" + store_path);
      auto c = ranks[r].Configure(req);
      if (!c.ok()) {
        results[r] = c.status();
        return;
      }
      for (int i = 0; i < steps; ++i) {
        auto s = ranks[r].TrainStep(step(i));
        if (!s.ok()) {
          results[r] = s.status();
          return;
        }
      }
      if (after) results[r] = after(r, ranks[r]);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  // A collective: only when no rank has left the group.
  for (const absl::Status& s : results) gather = gather && s.ok();
  if (!gather) return results;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { results[r] = ranks[r].GatherPolicy(); });
  for (auto& t : threads) t.join();
  return results;
}

// An `after` for TrainShards: every rank saves (Save("")), and rank 0's
// checkpoint path goes to *rank0_path.
inline std::function<absl::Status(int, Trainer&)> SaveKeepingRank0Path(std::string* rank0_path) {
  return [rank0_path](int rank, Trainer& t) -> absl::Status {
    auto saved = t.Save();
    if (saved.ok() && rank == 0) *rank0_path = saved->path();
    return saved.status();
  };
}

// max |a - b| over the elements; +infinity when any is NaN, which
// std::max (and so a running maximum) would silently drop.
inline double AbsDiffMax(const at::Tensor& a, const at::Tensor& b) {
  const double d = (a - b).abs().max().item<double>();
  return std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
}

// The largest difference between two trainers' policy weights (rank 0's
// under TP, ZeRO-3 and EP, where only it holds them whole); infinity when
// their parameters differ in number or names.
inline double MaxAbsDiff(Trainer& a, Trainer& b) {
  auto pa = a.PolicyParameters(), pb = b.PolicyParameters();
  if (pa.size() != pb.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    if (pa[i].first != pb[i].first) return std::numeric_limits<double>::infinity();
    m = std::max(m, AbsDiffMax(pa[i].second, pb[i].second));
  }
  return m;
}

// Elements of policy.exp_avg in a checkpoint's optimizer file; -1 when it
// cannot be read.
inline int64_t MomentsNumel(const std::string& file) {
  auto f = actor::SafetensorsFile::Open(file);
  if (!f.ok()) return -1;
  auto m = (*f)->Read("policy.exp_avg");
  return m.ok() ? m->numel() : -1;
}

// The largest difference between the weights in two checkpoint folders'
// `sub`/model.safetensors ("critic" for PPO's critic); infinity when either
// cannot be read or their tensors differ in names or shapes.
inline double MaxAbsDiffOfFolders(const std::string& a, const std::string& b, const std::string& sub) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto fa = actor::SafetensorsFile::Open(a + "/" + sub + "/model.safetensors");
  auto fb = actor::SafetensorsFile::Open(b + "/" + sub + "/model.safetensors");
  if (!fa.ok() || !fb.ok() || (*fa)->entries().size() != (*fb)->entries().size()) return kInf;
  double m = 0;
  for (const auto& entry : (*fa)->entries()) {
    auto ta = (*fa)->Read(entry.name), tb = (*fb)->Read(entry.name);
    if (!ta.ok() || !tb.ok() || ta->sizes() != tb->sizes()) return kInf;
    m = std::max(m, AbsDiffMax(*ta, *tb));
  }
  return m;
}

}  // namespace rlmesh::learner::testing
