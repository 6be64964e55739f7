#include "learner/batching.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <iterator>
#include <map>

#include "actor/attention_inputs.h"

namespace rlmesh::learner {

std::vector<TrajectoryGroup> RankSlice(std::vector<TrajectoryGroup> all, int rank, int world, int mini_batches) {
  const int64_t G = static_cast<int64_t>(all.size());
  const int64_t M = std::max(1, mini_batches);
  std::vector<TrajectoryGroup> mine;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t begin = m * G / M, n = (m + 1) * G / M - begin;
    const int64_t lo = begin + rank * n / world, hi = begin + (rank + 1) * n / world;
    for (int64_t g = lo; g < hi; ++g) mine.push_back(std::move(all[g]));
  }
  return mine;
}

std::vector<TrajectoryGroup> KeepInformativeGroups(std::vector<TrajectoryGroup> all, int64_t keep,
                                                   Metrics* metrics) {
  std::vector<TrajectoryGroup> kept;
  int64_t zero_variance = 0, surplus = 0;
  for (TrajectoryGroup& g : all) {
    bool varies = false;
    for (int i = 1; i < g.samples_size() && !varies; ++i) varies = g.samples(i).reward() != g.samples(0).reward();
    if (!varies) {
      ++zero_variance;
    } else if (static_cast<int64_t>(kept.size()) < keep) {
      kept.push_back(std::move(g));
    } else {
      ++surplus;
    }
  }
  if (metrics != nullptr) {
    (*metrics)["refill_groups_sampled"] = static_cast<double>(all.size());
    (*metrics)["refill_groups_zero_variance"] = static_cast<double>(zero_variance);
    (*metrics)["refill_groups_surplus"] = static_cast<double>(surplus);
  }
  return kept;
}

Seq PromptResponseSeq(const std::vector<int>& prompt, const std::vector<int>& response, int64_t max_len,
                      int64_t first_masked) {
  Seq q;
  q.ids.assign(prompt.begin(), prompt.end());
  q.ids.insert(q.ids.end(), response.begin(), response.end());
  if (static_cast<int64_t>(q.ids.size()) > max_len) q.ids.resize(max_len);
  const int64_t L = q.ids.size();
  q.mask.assign(L, 0.0f);
  for (int64_t t = std::max<int64_t>(0, first_masked); t + 1 < L; ++t) q.mask[t] = 1.0f;
  return q;
}

namespace {

// A packed batch of [R, W] slots, all padding at first, and how its slots
// are filled.
class PackedBatchWriter {
 public:
  PackedBatchWriter(int64_t R, int64_t W) {
    b_.input_ids = at::zeros({R, W}, at::kLong);
    b_.positions = at::zeros({R, W}, at::kLong);
    b_.targets = at::full({R, W}, -1, at::kLong);
    b_.mask = at::zeros({R, W}, at::kFloat);
    b_.segments = at::zeros({R, W}, at::kLong);
    ids_ = b_.input_ids.data_ptr<int64_t>();
    pos_ = b_.positions.data_ptr<int64_t>();
    targets_ = b_.targets.data_ptr<int64_t>();
    mask_ = b_.mask.data_ptr<float>();
    segments_ = b_.segments.data_ptr<int64_t>();
    width_ = W;
  }

  // Token t of `s` (at position t, predicting token t + 1) into slot x of
  // row r, in segment `id`.
  void Put(const Seq& s, int64_t t, int64_t r, int64_t x, int64_t id) {
    const int64_t i = r * width_ + x, L = s.ids.size();
    ids_[i] = s.ids[t];
    pos_[i] = t;
    segments_[i] = id;
    if (t + 1 < L) targets_[i] = s.ids[t + 1];
    if (t < static_cast<int64_t>(s.mask.size())) mask_[i] = s.mask[t];
    ++b_.tokens;
  }

  Batch Take() { return std::move(b_); }

 private:
  Batch b_;
  int64_t* ids_ = nullptr;
  int64_t* pos_ = nullptr;
  int64_t* targets_ = nullptr;
  float* mask_ = nullptr;
  int64_t* segments_ = nullptr;
  int64_t width_ = 0;
};

// The first p tokens the members can share: their first p + 1 ids are equal
// and no position before p is in the loss.
int64_t SharedPrefix(const std::vector<const Seq*>& members) {
  const Seq& first = *members[0];
  int64_t common = first.ids.size();
  for (const Seq* s : members) {
    int64_t c = 0;
    const int64_t n = std::min<int64_t>(common, s->ids.size());
    while (c < n && s->ids[c] == first.ids[c]) ++c;
    common = c;
    int64_t loss = 0;
    while (loss < static_cast<int64_t>(s->mask.size()) && s->mask[loss] == 0.0f) ++loss;
    common = std::min(common, loss + 1);
  }
  return std::max<int64_t>(0, common - 1);
}

}  // namespace

Batch MakePackedBatch(const std::vector<Seq>& seqs, int64_t row_len, std::vector<int64_t>* row_lengths) {
  std::vector<std::vector<const Seq*>> rows;
  std::vector<int64_t> used;
  for (const Seq& s : seqs) {
    const int64_t L = s.ids.size();
    size_t r = 0;
    while (r < rows.size() && used[r] + L > row_len) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.push_back(0);
    }
    rows[r].push_back(&s);
    used[r] += L;
  }
  return MakeRowsBatch(rows, row_lengths);
}

Batch MakeRowsBatch(const std::vector<std::vector<const Seq*>>& rows, std::vector<int64_t>* row_lengths) {
  row_lengths->clear();
  for (const auto& row : rows) {
    int64_t L = 0;
    for (const Seq* s : row) L += static_cast<int64_t>(s->ids.size());
    row_lengths->push_back(L);
  }
  int64_t T = 1;
  for (int64_t l : *row_lengths) T = std::max(T, l);
  const int64_t B = rows.size();
  PackedBatchWriter w(B, T);
  for (int64_t r = 0; r < B; ++r) {
    int64_t at = 0, id = 0;
    for (const Seq* s : rows[r]) {
      ++id;
      const int64_t L = s->ids.size();
      for (int64_t t = 0; t < L; ++t) w.Put(*s, t, r, at + t, id);
      at += L;
    }
  }
  return w.Take();
}

double PairCost(const actor::ModelConfig& c) {
  const double per_layer = static_cast<double>(c.hidden_size) * (2 * c.num_heads + 2 * c.num_kv_heads) * c.HeadDim() +
                           3.0 * static_cast<double>(c.hidden_size) * c.intermediate_size;
  const double per_token = 2.0 * (c.num_layers * per_layer + static_cast<double>(c.hidden_size) * c.vocab_size);
  return per_token > 0 ? 4.0 * c.num_layers * c.num_heads * c.HeadDim() / per_token : 0.0;
}

int64_t PromptToShare(const std::vector<const Seq*>& members, double pair_cost) {
  if (members.size() < 2) return 0;
  const int64_t p = SharedPrefix(members);
  if (p == 0) return 0;
  double alone = 0, U = static_cast<double>(p);
  for (const Seq* s : members) {
    const double L = s->ids.size();
    alone += L + pair_cost * L * L;
    U += L - static_cast<double>(p);
  }
  return U + pair_cost * U * U < alone ? p : 0;
}

namespace {

// What PackSeqs places in a row: one sequence (prefix = 0), or a group's
// shared first `prefix` tokens followed by each member's tokens from there.
struct PackUnit {
  int64_t prefix = 0;
  std::vector<int64_t> members;  // indices into seqs
  int64_t length = 0;            // slots in a row
};

std::vector<PackUnit> PackUnits(const std::vector<Seq>& seqs, int64_t begin, int64_t end,
                                const PrefixSharing& sharing) {
  std::vector<PackUnit> units;
  std::vector<bool> placed(end - begin, false);
  if (sharing.groups != nullptr) {
    std::map<int64_t, std::vector<int64_t>> by_group;
    for (int64_t i = begin; i < end; ++i) by_group[(*sharing.groups)[i]].push_back(i);
    for (auto& [group, members] : by_group) {
      std::vector<const Seq*> rows;
      for (int64_t i : members) rows.push_back(&seqs[i]);
      const int64_t p = PromptToShare(rows, sharing.pair_cost);
      if (p == 0) continue;
      PackUnit u;
      u.prefix = p;
      u.length = p;
      for (int64_t i : members) {
        u.length += static_cast<int64_t>(seqs[i].ids.size()) - p;
        placed[i - begin] = true;
      }
      u.members = std::move(members);
      units.push_back(std::move(u));
    }
  }
  for (int64_t i = begin; i < end; ++i) {
    if (placed[i - begin]) continue;
    PackUnit u;
    u.members = {i};
    u.length = seqs[i].ids.size();
    units.push_back(std::move(u));
  }
  // Longest first; ties keep the first member's order.
  std::stable_sort(units.begin(), units.end(), [](const PackUnit& x, const PackUnit& y) {
    return x.length != y.length ? x.length > y.length : x.members[0] < y.members[0];
  });
  return units;
}

}  // namespace

PackedRows PackSeqs(const std::vector<Seq>& seqs, int64_t begin, int64_t end, int64_t row_len,
                    const PrefixSharing& sharing) {
  std::vector<PackUnit> units = PackUnits(seqs, begin, end, sharing);
  int64_t W = row_len;
  for (const PackUnit& u : units) W = std::max(W, u.length);
  // First fit: rows[r] = its units in order.
  std::vector<std::vector<const PackUnit*>> rows;
  std::vector<int64_t> used;
  for (const PackUnit& u : units) {
    size_t r = 0;
    while (r < rows.size() && used[r] + u.length > W) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.push_back(0);
    }
    rows[r].push_back(&u);
    used[r] += u.length;
  }
  PackedRows p;
  p.seqs = end - begin;
  p.row_len = row_len;
  const int64_t R = rows.size();
  W = 1;
  for (int64_t u : used) W = std::max(W, u);
  PackedBatchWriter w(R, W);
  p.gather = at::full({p.seqs * row_len}, R * W, at::kLong);
  auto g = p.gather.accessor<int64_t, 1>();
  // Tokens [from, to) of `s` at slots [at, ...) of row r, segment `id`;
  // returns the next free slot.
  auto place = [&](const Seq& s, int64_t from, int64_t to, int64_t r, int64_t at, int64_t id) {
    for (int64_t t = from; t < to; ++t) w.Put(s, t, r, at + t - from, id);
    return at + to - from;
  };
  // Positions [from, L) of sequence i (of [begin, end)) sit at slots
  // [at, ...) of row r.
  auto gather_from = [&](int64_t i, int64_t from, int64_t L, int64_t r, int64_t at) {
    for (int64_t t = from; t < L; ++t) g[i * row_len + t] = r * W + at + t - from;
  };
  for (int64_t r = 0; r < R; ++r) {
    int64_t at = 0, k = 0;
    for (const PackUnit* u : rows[r]) {
      ++k;
      if (u->prefix == 0) {
        const Seq& s = seqs[u->members[0]];
        gather_from(u->members[0] - begin, 0, s.ids.size(), r, at);
        at = place(s, 0, s.ids.size(), r, at, k);
        continue;
      }
      // The prefix once, then each member from token `prefix` on. The
      // prefix's last position predicts token `prefix`, equal in every
      // member, so its outputs are every member's.
      const int64_t base = k * actor::kSharedPrefixStride, prefix_at = at;
      at = place(seqs[u->members[0]], 0, u->prefix, r, at, base);
      for (size_t j = 0; j < u->members.size(); ++j) {
        const Seq& s = seqs[u->members[j]];
        const int64_t i = u->members[j] - begin;
        gather_from(i, 0, u->prefix, r, prefix_at);
        gather_from(i, u->prefix, s.ids.size(), r, at);
        at = place(s, u->prefix, s.ids.size(), r, at, base + 1 + static_cast<int64_t>(j));
      }
      p.shared_seqs += static_cast<int64_t>(u->members.size());
    }
  }
  p.batch = w.Take();
  return p;
}

at::Tensor PackedRows::Unpack(const at::Tensor& packed) const {
  const at::Tensor flat = at::cat({packed.reshape({-1}), at::zeros({1}, packed.options())});
  return flat.index_select(0, gather.to(packed.device())).view({seqs, row_len});
}

at::Tensor PackedRows::Pack(const at::Tensor& padded, const at::Scalar& fill) const {
  const int64_t slots = batch.input_ids.numel();
  std::vector<int64_t> shape = padded.sizes().vec();
  shape[0] = slots + 1;  // the zero slot takes every padded position past a sequence's end
  at::Tensor out = at::full(shape, fill, padded.options());
  out.index_copy_(0, gather.to(padded.device()), padded);
  return out.narrow(0, 0, slots);
}

Batch MakeBatch(const std::vector<Seq>& seqs, bool with_behaviour) {
  int64_t T = 1;
  for (const Seq& s : seqs) T = std::max<int64_t>(T, s.ids.size());
  const int64_t B = seqs.size();
  Batch b;
  b.input_ids = at::zeros({B, T}, at::kLong);
  b.targets = at::full({B, T}, -1, at::kLong);
  b.mask = at::zeros({B, T}, at::kFloat);
  if (with_behaviour) b.behaviour = at::zeros({B, T}, at::kFloat);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto tg = b.targets.accessor<int64_t, 2>();
  auto m = b.mask.accessor<float, 2>();
  for (int64_t r = 0; r < B; ++r) {
    const Seq& s = seqs[r];
    const int64_t L = s.ids.size();
    b.tokens += L;
    for (int64_t t = 0; t < L; ++t) {
      ids[r][t] = s.ids[t];
      if (t + 1 < L) tg[r][t] = s.ids[t + 1];
      if (t < static_cast<int64_t>(s.mask.size())) m[r][t] = s.mask[t];
    }
    if (with_behaviour) {
      auto bh = b.behaviour.accessor<float, 2>();
      for (int64_t t = 0; t < static_cast<int64_t>(s.behaviour.size()); ++t) bh[r][t] = s.behaviour[t];
    }
  }
  b.positions = at::arange(T, at::kLong).unsqueeze(0).expand({B, T}).contiguous();
  return b;
}

at::Tensor Rows(const at::Tensor& full, int64_t begin, int64_t end, int64_t T) {
  return full.narrow(0, begin, end - begin).narrow(1, 0, T);
}

std::vector<std::pair<int64_t, int64_t>> MicroBatches(const std::vector<int64_t>& lengths, int64_t begin,
                                                      int64_t end, int64_t max_tokens,
                                                      const std::vector<bool>* together) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = begin, longest = 0;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t l = std::max<int64_t>(longest, lengths[r]);
    if (r > start && (r - start + 1) * l > max_tokens) {
      // Cut where r's run of rows begins, when it began after `start`.
      int64_t cut = r;
      if (together != nullptr) {
        while (cut > start && (*together)[cut]) --cut;
        if (cut == start) cut = r;
      }
      out.emplace_back(start, cut);
      start = cut;
      longest = *std::max_element(lengths.begin() + start, lengths.begin() + r + 1);
      if (r > start && (r - start + 1) * longest > max_tokens) {
        // The run alone is over the budget: split it here after all.
        out.emplace_back(start, r);
        start = r;
        longest = lengths[r];
      }
    } else {
      longest = l;
    }
  }
  if (end > start) out.emplace_back(start, end);
  return out;
}

std::vector<std::pair<int64_t, int64_t>> AtLeastMicroBatches(std::vector<std::pair<int64_t, int64_t>> micro,
                                                             int64_t at_least, const std::vector<bool>* together) {
  auto can_cut = [&](int64_t r) { return together == nullptr || !(*together)[r]; };
  while (static_cast<int64_t>(micro.size()) < at_least) {
    // The widest micro-batch with a boundary it may be cut at, and the cut
    // nearest its middle.
    int64_t best = -1, best_cut = -1, best_rows = 1;
    for (size_t k = 0; k < micro.size(); ++k) {
      const auto [a, e] = micro[k];
      if (e - a <= best_rows) continue;
      const int64_t mid = a + (e - a) / 2;
      int64_t cut = -1;
      for (int64_t d = 0; d < e - a && cut < 0; ++d) {
        if (mid - d > a && can_cut(mid - d)) cut = mid - d;
        else if (mid + d < e && mid + d > a && can_cut(mid + d)) cut = mid + d;
      }
      if (cut < 0) continue;
      best = static_cast<int64_t>(k);
      best_cut = cut;
      best_rows = e - a;
    }
    if (best < 0) break;
    const auto [a, e] = micro[best];
    micro[best] = {a, best_cut};
    micro.insert(micro.begin() + best + 1, {best_cut, e});
  }
  return micro;
}

}  // namespace rlmesh::learner
