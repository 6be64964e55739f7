// Context parallelism must compute and train as one process: Gloo groups on
// threads over a HashStore, each rank a ContextParallelModel holding its
// zig-zag share of every row's tokens; the log-probs equal the whole
// model's, and three clipped AdamW steps (DataParallel over every rank,
// each weighing 1/C of its replica's loss tokens) give one process's weights within
// 3e-5 at cp = 2, cp = 4, cp = 2 x dp = 2 and cp = 2 x tp = 2 (with and
// without dp = 2), for Llama and Qwen3, the keys and values passed by ring
// or by c10d's collectives; with packed rows' segment ids, shared
// prefixes and padding masks; and with every layer activation-checkpointed
// and the moments sharded (ZeRO-1).
#include "learner/context_parallel.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actor/attention_inputs.h"
#include "catch2/catch.hpp"
#include "learner/data_parallel.h"
#include "learner/testing/model_parallel_testing.h"
#include "parallel/tensor_parallel.h"

namespace rlmesh::learner {
namespace {

using namespace model_parallel_testing;  // NOLINT: the shared fixture

// Rows of `t` tokens with next-token targets, the last row padded after
// two thirds of them.
Batch LongBatch(int64_t rows, int64_t t) {
  at::manual_seed(21);
  Batch b;
  b.ids = at::randint(0, 48, {rows, t}, at::kLong);
  b.pos = at::arange(t, at::kLong).unsqueeze(0).expand({rows, t}).contiguous();
  b.mask = at::ones({rows, t}, at::kFloat);
  b.targets = at::full({rows, t}, -1, at::kLong);
  b.targets.narrow(1, 0, t - 1).copy_(b.ids.narrow(1, 1, t - 1));
  const int64_t real = 2 * t / 3;
  b.mask[rows - 1].narrow(0, real, t - real).zero_();
  b.targets[rows - 1].narrow(0, real - 1, t - real + 1).fill_(-1);
  return b;
}

// Rows of `t` tokens packed with documents of `lengths` (taken in turn):
// segment ids 1, 2, ..., positions restarting per document, no target
// across a document's end, and the last row's final 5 tokens padding
// (segment 0). With `shared`, a row's first document is a prefix (id
// kSharedPrefixStride) that its next two continue (ids kSharedPrefixStride
// + 1 and + 2, positions following the prefix's), as learner/batching.h
// lays out a group's shared prompt. `scored` > 0: only each document's
// last `scored` tokens have targets (a prompt and its response).
Batch PackedBatch(int64_t rows, int64_t t, const std::vector<int64_t>& lengths, bool shared = false,
                  int64_t scored = 0) {
  at::manual_seed(23);
  Batch b;
  b.ids = at::randint(0, 48, {rows, t}, at::kLong);
  b.pos = at::zeros({rows, t}, at::kLong);
  b.mask = at::zeros({rows, t}, at::kLong);
  b.targets = at::full({rows, t}, -1, at::kLong);
  auto ids = b.ids.accessor<int64_t, 2>();
  auto pos = b.pos.accessor<int64_t, 2>(), seg = b.mask.accessor<int64_t, 2>(), tg = b.targets.accessor<int64_t, 2>();
  size_t next = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t end = r == rows - 1 ? t - 5 : t;
    int64_t prefix = 0;
    for (int64_t at = 0, doc = 1; at < end; ++doc) {
      const int64_t len = std::min(lengths[next++ % lengths.size()], end - at);
      int64_t id = doc, first = 0;
      if (shared && doc == 1) {
        id = actor::kSharedPrefixStride;
        prefix = len;
      } else if (shared && doc <= 3) {
        id = actor::kSharedPrefixStride + doc - 1;
        first = prefix;
      }
      for (int64_t k = 0; k < len; ++k) {
        seg[r][at + k] = id;
        pos[r][at + k] = first + k;
        if (k + 1 < len && (scored == 0 || k + 1 + scored >= len)) tg[r][at + k] = ids[r][at + k + 1];
      }
      at += len;
    }
  }
  return b;
}

struct RankRun {
  std::vector<double> norms;
  Named weights;
  at::Tensor logprobs;  // the first forward's, at this rank's positions
  at::Tensor mine;
  Named first_grads;  // the first step's averaged gradient
  // The first forward's autograd graph: its nodes' names, one per node.
  std::vector<std::string> graph;
};

// The names of the autograd nodes that `t`'s gradient would pass through.
std::vector<std::string> GraphNodeNames(const at::Tensor& t) {
  std::vector<std::string> names;
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo = {t.grad_fn().get()};
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    names.push_back(n->name());
    for (const auto& edge : n->next_edges()) todo.push_back(edge.function.get());
  }
  return names;
}

// How many of `names` contain `part`.
int64_t CountContaining(const std::vector<std::string>& names, const std::string& part) {
  return std::count_if(names.begin(), names.end(), [&](const std::string& n) { return absl::StrContains(n, part); });
}

// How the ranks split the work: cp x dp x tp ranks, the keys and values by
// `exchange`, the batch's attention mask given to the ranks (`with_mask`;
// the reference always takes it), every layer activation-checkpointed
// (`checkpoint`), and the optimizer's moments sharded over the ranks
// holding the same weights (`zero1`).
struct Layout {
  int cp = 1, dp = 1, tp = 1;
  KeyValueExchange exchange = KeyValueExchange::kRing;
  bool with_mask = false;
  bool checkpoint = false;
  bool zero1 = false;
};

// `world` = dp x cp x tp ranks on threads (rank = (replica * cp + context
// rank) * tp + tensor rank): the optimizer over the ranks holding the same
// slices (every rank without TP), each replica's ranks with the same slices
// in a context-parallel group and the ranks with the same tokens in a
// tensor-parallel group; replica d trains rows [d * B/dp, ...). The
// weights and first gradients come back whole (gathered under TP).
std::vector<RankRun> TrainContextParallel(const actor::ModelConfig& c, const Named& init, const Batch& batch,
                                          const Layout& l) {
  const int cp = l.cp, dp = l.dp, tp = l.tp;
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::future<absl::StatusOr<RankRun>>> futures;
  const int world_size = cp * dp * tp;
  std::vector<HeldGroups> keep(world_size);
  const int64_t per = batch.ids.size(0) / dp;
  for (int rank = 0; rank < world_size; ++rank) {
    futures.push_back(std::async(std::launch::async, [&, rank]() -> absl::StatusOr<RankRun> {
      const int t = rank % tp, r = (rank / tp) % cp, d = rank / (tp * cp);
      c10::intrusive_ptr<c10d::Backend> opt_group, cp_group, tp_group;
      absl::Status joined = keep[rank].Join(store, absl::StrCat("opt", t), rank / tp, cp * dp, &opt_group);
      if (joined.ok()) joined = keep[rank].Join(store, absl::StrCat("cp", d, ".", t), r, cp, &cp_group);
      if (joined.ok()) joined = keep[rank].Join(store, absl::StrCat("tp", d, ".", r), t, tp, &tp_group);
      if (!joined.ok()) return joined;
      DataParallelOptions o = Optimizer();
      o.zero1 = l.zero1;
      std::unique_ptr<parallel::TensorParallelModel> tp_model;
      absl::StatusOr<std::unique_ptr<ContextParallelModel>> model;
      if (tp > 1) {
        parallel::TensorParallelOptions to;
        to.activation_checkpointing = l.checkpoint;
        auto made = parallel::TensorParallelModel::Create(c, tp_group, to);
        if (!made.ok()) return made.status();
        tp_model = *std::move(made);
        model = ContextParallelModel::WrapTensorParallel(*tp_model, cp_group, 4);
        o.norm_groups = {tp_group};
        o.norm_weights = tp_model->NormWeights();
      } else {
        actor::Transformer whole(c);
        whole->set_activation_checkpointing(l.checkpoint);
        model = ContextParallelModel::Wrap(whole, cp_group, 4);
      }
      if (!model.ok()) return model.status();
      (*model)->set_key_value_exchange(l.exchange);
      absl::Status s = (*model)->LoadFromFull(init);
      if (!s.ok()) return s;
      auto opt = DataParallel::Create(opt_group, (*model)->Parameters(), o);
      if (!opt.ok()) return opt.status();
      // The whole model's tensors from this rank's (its slices under TP).
      auto whole = [&](const Named& local) -> absl::StatusOr<Named> {
        if (!tp_model) return local;
        std::vector<at::Tensor> v;
        for (const auto& [name, x] : local) v.push_back(x);
        return tp_model->GatherFullOf(v);
      };
      const Batch rows = Rows(batch, d * per, d == dp - 1 ? batch.ids.size(0) - d * per : per);
      RankRun run;
      for (int step = 0; step < kSteps; ++step) {
        (*opt)->ZeroGrad();
        auto out = (*model)->TokenLogProbs(rows.ids, rows.pos, rows.targets, 0.9,
                                           l.with_mask ? rows.mask : at::Tensor());
        if (!out.ok()) return out.status();
        if (step == 0) {
          run.logprobs = out->out.logprobs.detach().clone();
          run.mine = out->mine;
          run.graph = GraphNodeNames(out->out.logprobs);
        }
        // The replica's loss tokens split evenly over its context ranks: each
        // rank's gradient reaches the others' keys and values, so every rank
        // scales its tokens' sum alike (see context_parallel.h).
        const at::Tensor valid = rows.targets.ge(0).to(at::kFloat) * out->mine;
        const double w = Weight(rows) / cp;
        at::Tensor loss = -(out->out.logprobs * valid).sum() / w - 0.01 * (out->out.entropy * valid).sum() / w;
        loss.backward();
        if (step == 0) {
          // DataParallel's average, taken here to compare before AdamW.
          at::Tensor total = at::full({1}, w, at::kDouble);
          std::vector<at::Tensor> tw{total};
          opt_group->allreduce(tw)->wait();
          Named averaged;
          for (auto& [name, p] : (*model)->NamedParameters()) {
            std::vector<at::Tensor> g{p.grad().mul(w).contiguous()};
            opt_group->allreduce(g)->wait();
            averaged.emplace_back(name, g[0] / total.item<double>());
          }
          auto gathered = whole(averaged);
          if (!gathered.ok()) return gathered.status();
          run.first_grads = *std::move(gathered);
        }
        auto stats = (*opt)->Step(w, kLr);
        if (!stats.ok()) return stats.status();
        run.norms.push_back(stats->grad_norm);
      }
      Named weights;
      for (auto& [name, p] : (*model)->NamedParameters()) weights.emplace_back(name, p.detach().clone());
      auto gathered = whole(weights);
      if (!gathered.ok()) return gathered.status();
      run.weights = *std::move(gathered);
      return run;
    }));
  }
  std::vector<RankRun> out;
  for (auto& f : futures) {
    REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    auto r = f.get();
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    out.push_back(*r);
  }
  return out;
}

// One process's first gradient of the fixture's loss on `batch`.
Named FirstGradients(const actor::ModelConfig& c, const Named& init, const Batch& batch) {
  actor::Transformer m(c);
  {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> src(init.begin(), init.end());
    for (auto& [name, p] : m->NamedParameters()) p.copy_(src.at(name));
  }
  auto out = actor::TokenLogProbs(m, batch.ids, batch.pos, batch.targets, 4, 0.9, batch.mask);
  REQUIRE(out.ok());
  Loss(*out, batch.targets).backward();
  Named g;
  for (auto& [name, p] : m->NamedParameters()) g.emplace_back(name, p.grad().clone());
  return g;
}

// 3e-5 on the weights after three steps: AdamW divides by sqrt(v),
// which magnifies the gradients' last-bit differences (the other summation
// order of the ranks' parts) for the entries whose gradient is small;
// the first gradient itself is held to 1e-6.
// `with_mask`: the ranks take the batch's attention mask too (the
// reference always does).
void CheckEqualsReference(const std::string& arch, const Batch& batch, const Layout& l) {
  const int cp = l.cp, dp = l.dp, tp = l.tp;
  CAPTURE(arch, cp, dp, tp, batch.ids.size(1), l.exchange == KeyValueExchange::kRing, l.with_mask, l.checkpoint,
          l.zero1);
  actor::ModelConfig c = SmallConfig(arch);
  const Named init = InitialWeights(c);
  const Run ref = Reference(c, init, batch);
  const Named ref_grads = FirstGradients(c, init, batch);
  REQUIRE(ref.norms[0] > Optimizer().grad_clip);
  REQUIRE(MaxAbsDiff(ref.weights, init) > 1e-3);
  // The first forward's log-probs, laid side by side, are the whole model's.
  at::Tensor whole_lp;
  {
    actor::Transformer m(c);
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> src(init.begin(), init.end());
    for (auto& [name, p] : m->NamedParameters()) p.copy_(src.at(name));
    auto o = actor::TokenLogProbs(m, batch.ids, batch.pos, batch.targets, 4, 0.9, batch.mask);
    REQUIRE(o.ok());
    whole_lp = o->logprobs;
  }
  const std::vector<RankRun> runs = TrainContextParallel(c, init, batch, l);
  const int64_t per = batch.ids.size(0) / dp;
  for (int d = 0; d < dp; ++d) {
    for (int t = 0; t < tp; ++t) {
      // Rank (d * cp + r) * tp + t: context rank r of replica d, slice t.
      auto at_rank = [&](int r) -> const RankRun& { return runs[(d * cp + r) * tp + t]; };
      at::Tensor joined = at::zeros_like(at_rank(0).logprobs), covered = at::zeros_like(at_rank(0).mine);
      for (int r = 0; r < cp; ++r) {
        joined = joined + at_rank(r).logprobs;
        covered = covered + at_rank(r).mine;
      }
      // Every position held by exactly one rank.
      CHECK(at::equal(covered, at::ones_like(covered)));
      const int64_t n = d == dp - 1 ? batch.ids.size(0) - d * per : per;
      CHECK(AbsDiffMax(joined, whole_lp.narrow(0, d * per, n)) < 1e-5);
    }
  }
  for (const RankRun& r : runs) {
    // Checkpointed, the graph holds one node per layer and no attention:
    // the layers' own nodes exist only while the backward pass reruns them.
    const int64_t blocks = CountContaining(r.graph, "CheckpointedBlock");
    const int64_t attention = CountContaining(r.graph, "AttentionFunction");
    CHECK(blocks == (l.checkpoint ? c.num_layers : 0));
    CHECK(attention == (l.checkpoint ? 0 : c.num_layers));
    CHECK(MaxAbsDiff(r.first_grads, ref_grads) < 1e-6);
    for (int step = 0; step < kSteps; ++step) CHECK(r.norms[step] == Approx(ref.norms[step]).epsilon(1e-5));
    CHECK(MaxAbsDiff(r.weights, ref.weights) < 3e-5);
  }
}

TEST_CASE("the zig-zag split: rank r holds chunks r and 2C - 1 - r, T padded to a multiple of 2C") {
  CHECK(ZigZagPositions(8, 0, 2) == std::vector<int64_t>{0, 1, 6, 7});
  CHECK(ZigZagPositions(8, 1, 2) == std::vector<int64_t>{2, 3, 4, 5});
  CHECK(ZigZagPositions(7, 1, 2) == std::vector<int64_t>{2, 3, 4, 5});
  CHECK(ZigZagPositions(7, 0, 2) == std::vector<int64_t>{0, 1, 6, 7});  // 7 is padding
  CHECK(ZigZagPositions(16, 3, 4) == std::vector<int64_t>{6, 7, 8, 9});
}

TEST_CASE("cp=2 and cp=4 equal one process: log-probs and three clipped AdamW steps, llama and qwen3") {
  for (const char* arch : {"llama", "qwen3"}) {
    CheckEqualsReference(arch, MakeBatch(), {2, 1});
    CheckEqualsReference(arch, LongBatch(2, 29), {2, 1});
    CheckEqualsReference(arch, LongBatch(2, 29), {4, 1});
  }
}

// The cases above pass the keys and values by ring (the default); c10d's
// all-gather and all-reduce give the same. At cp = 4 a ring that filed a
// share under the wrong rank fails both, where cp = 2 cannot tell.
TEST_CASE("keys and values by c10d's collectives instead of the ring: the same at cp=2 and cp=4") {
  for (const char* arch : {"llama", "qwen3"}) {
    for (int cp : {2, 4}) {
      CheckEqualsReference(arch, LongBatch(2, 29), {cp, 1, 1, KeyValueExchange::kCollectives});
    }
  }
}

TEST_CASE("cp=2 x dp=2 equals one process") {
  for (const char* arch : {"llama", "qwen3"}) CheckEqualsReference(arch, LongBatch(4, 24), {2, 2});
}

TEST_CASE("cp=2 x tp=2 equals one process: each rank its slices' heads on its share of the tokens") {
  for (const char* arch : {"llama", "qwen3"}) {
    CheckEqualsReference(arch, LongBatch(2, 29), {2, 1, 2});
    CheckEqualsReference(arch, LongBatch(4, 24), {2, 2, 2});
  }
}

// Packed rows: every rank masks its attention blocks by the whole row's
// segment ids. At 600 tokens and cp = 2 a query chunk's keys span up to
// three blocks of 256, and most blocks of a row of short documents are
// seen by none of the chunk's queries (skipped); at cp = 4 and 29 tokens
// the documents cross the chunks' borders.
TEST_CASE("packed rows (segment ids, shared prefixes) and padding masks at cp=2 and cp=4 equal one process") {
  for (const char* arch : {"llama", "qwen3"}) {
    CheckEqualsReference(arch, PackedBatch(2, 29, {5, 9, 3, 12}), {2, 1, 1, KeyValueExchange::kRing, true});
    CheckEqualsReference(arch, PackedBatch(2, 29, {5, 9, 3, 12}, true), {4, 1, 1, KeyValueExchange::kRing, true});
    CheckEqualsReference(arch, LongBatch(2, 29), {2, 1, 1, KeyValueExchange::kRing, true});
  }
  CheckEqualsReference("qwen3", PackedBatch(2, 600, {70, 130, 41}, true, 4),
                       {2, 1, 1, KeyValueExchange::kRing, true});
  CheckEqualsReference("llama", PackedBatch(4, 24, {7, 11}), {2, 2, 2, KeyValueExchange::kRing, true});
}

// Checkpointed layers run their key and value exchange again in the
// backward pass, on every rank in the same order; ZeRO-1 shards the moments
// over the ranks holding the same weights (every context rank and replica).
TEST_CASE("activation checkpointing and ZeRO-1 under cp equal one process: alone, x dp=2, x tp=2, packed rows") {
  for (const char* arch : {"llama", "qwen3"}) {
    Layout checkpointed{2, 1};
    checkpointed.checkpoint = true;
    CheckEqualsReference(arch, LongBatch(2, 29), checkpointed);
  }
  Layout replicas{2, 2};
  replicas.checkpoint = true;
  replicas.zero1 = true;
  CheckEqualsReference("llama", LongBatch(4, 24), replicas);
  Layout sliced{2, 1, 2};
  sliced.checkpoint = true;
  sliced.zero1 = true;
  CheckEqualsReference("qwen3", LongBatch(2, 29), sliced);
  Layout packed{2, 1, 1, KeyValueExchange::kRing, true};
  packed.checkpoint = true;
  CheckEqualsReference("qwen3", PackedBatch(2, 29, {5, 9, 3, 12}, true), packed);
}

TEST_CASE("context parallelism refuses a misshapen attention mask, MoE and value-head models by name") {
  auto m = ContextParallelModel::Create(SmallConfig("llama"), nullptr);
  REQUIRE(m.ok());
  const Batch b = MakeBatch();
  auto masked = (*m)->TokenLogProbs(b.ids, b.pos, b.targets, 1.0, b.mask.narrow(1, 0, 3));
  CHECK(masked.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(masked.status().message(), "attention_mask"));
  actor::ModelConfig moe = SmallConfig("qwen3");
  moe.arch = "qwen3_moe";
  moe.num_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 16;
  CHECK(absl::StrContains(ValidateContextParallel(moe).message(), "MoE"));
  actor::ModelConfig value = SmallConfig("llama");
  value.value_head = true;
  CHECK(ValidateContextParallel(value).code() == absl::StatusCode::kUnimplemented);
  parallel::TensorParallelOptions sp;
  sp.sequence_parallel = true;
  auto tp = parallel::TensorParallelModel::Create(SmallConfig("llama"), nullptr, sp);
  REQUIRE(tp.ok());
  auto wrapped = ContextParallelModel::WrapTensorParallel(**tp, nullptr);
  CHECK(absl::StrContains(wrapped.status().message(), "learner.sequence_parallel"));
}

}  // namespace
}  // namespace rlmesh::learner
