#pragma once

// The fixture the model-parallel tests share (parallel/tensor_parallel_test,
// rollout/tp_engine_test, and learner/testing/model_parallel_testing.h's
// training layouts): a small model of each family, its initial weights, one
// batch with a padded row, tensor comparisons, and the threads that run one
// Gloo group.

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "actor/model_config.h"
#include "actor/transformer.h"
#include "catch2/catch.hpp"
#include "dist/gloo.h"

namespace rlmesh::parallel::model_testing {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

inline actor::ModelConfig SmallConfig(const std::string& arch) {
  actor::ModelConfig c;
  c.arch = arch;
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 32;
  c.tie_embeddings = arch == "qwen3";
  return c;
}

struct Batch {
  at::Tensor ids, pos, targets, mask;
};

// Three rows of seven tokens, the last row padded after four; targets are
// the next token (-1 past each row's end), so some rows score fewer tokens.
inline Batch MakeBatch() {
  at::manual_seed(11);
  Batch b;
  b.ids = at::randint(0, 48, {3, 7}, at::kLong);
  b.pos = at::arange(7, at::kLong).unsqueeze(0).expand({3, 7}).contiguous();
  b.mask = at::ones({3, 7}, at::kFloat);
  b.mask[2].narrow(0, 4, 3).zero_();
  b.targets = at::full({3, 7}, -1, at::kLong);
  b.targets.narrow(1, 0, 6).copy_(b.ids.narrow(1, 1, 6));
  b.targets[2].narrow(0, 3, 4).fill_(-1);
  return b;
}

inline Batch Rows(const Batch& b, int64_t begin, int64_t n) {
  return {b.ids.narrow(0, begin, n), b.pos.narrow(0, begin, n), b.targets.narrow(0, begin, n),
          b.mask.narrow(0, begin, n)};
}

inline Named InitialWeights(const actor::ModelConfig& c) {
  at::manual_seed(5);
  actor::Transformer m(c);
  Named out;
  for (auto& [name, p] : m->NamedParameters()) out.emplace_back(name, p.detach().clone());
  return out;
}

// max |a - b| over the elements; +infinity when any is NaN, which
// std::max (and so a running maximum) would silently drop.
inline double AbsDiffMax(const at::Tensor& a, const at::Tensor& b) {
  const double d = (a - b).abs().max().item<double>();
  return std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
}

// The largest difference, or -1 when the names or shapes differ (for rank
// threads, which must not call Catch2's REQUIRE).
inline double MaxAbsDiffOrMinusOne(const Named& a, const Named& b) {
  std::map<std::string, at::Tensor> bm(b.begin(), b.end());
  if (a.size() != b.size()) return -1;
  double worst = 0;
  for (const auto& [name, t] : a) {
    auto it = bm.find(name);
    if (it == bm.end() || it->second.sizes() != t.sizes()) return -1;
    worst = std::max(worst, AbsDiffMax(t, it->second));
  }
  return worst;
}

inline double MaxAbsDiff(const Named& a, const Named& b) {
  std::map<std::string, at::Tensor> bm(b.begin(), b.end());
  double worst = 0;
  for (const auto& [name, t] : a) {
    REQUIRE(bm.count(name) == 1);
    REQUIRE(bm[name].sizes() == t.sizes());
    worst = std::max(worst, AbsDiffMax(t, bm[name]));
  }
  REQUIRE(a.size() == b.size());
  return worst;
}

// Runs `body(rank, group)` on `world` ranks, a thread each, every rank in one
// Gloo group over a fresh HashStore; fails the test when a rank is not done
// in two minutes or returns an error.
inline void OnRanks(int world,
                    const std::function<absl::Status(int, c10::intrusive_ptr<c10d::Backend>)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<absl::Status>> futures;
  for (int rank = 0; rank < world; ++rank) {
    futures.push_back(std::async(std::launch::async, [=]() -> absl::Status {
      auto g = dist::CreateGlooGroup(store, rank, world, {});
      if (!g.ok()) return g.status();
      return body(rank, *g);
    }));
  }
  for (auto& f : futures) {
    REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    const absl::Status s = f.get();
    INFO(s.ToString());
    CHECK(s.ok());
  }
}

}  // namespace rlmesh::parallel::model_testing
