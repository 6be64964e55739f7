#include "learner/batching.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <iterator>

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
  Batch b;
  b.input_ids = at::zeros({B, T}, at::kLong);
  b.positions = at::zeros({B, T}, at::kLong);
  b.targets = at::full({B, T}, -1, at::kLong);
  b.mask = at::zeros({B, T}, at::kFloat);
  b.segments = at::zeros({B, T}, at::kLong);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto pos = b.positions.accessor<int64_t, 2>();
  auto tg = b.targets.accessor<int64_t, 2>();
  auto m = b.mask.accessor<float, 2>();
  auto seg = b.segments.accessor<int64_t, 2>();
  for (int64_t r = 0; r < B; ++r) {
    int64_t at = 0, id = 0;
    for (const Seq* s : rows[r]) {
      ++id;
      const int64_t L = s->ids.size();
      b.tokens += L;
      for (int64_t t = 0; t < L; ++t) {
        ids[r][at + t] = s->ids[t];
        pos[r][at + t] = t;
        seg[r][at + t] = id;
        if (t + 1 < L) tg[r][at + t] = s->ids[t + 1];
        if (t < static_cast<int64_t>(s->mask.size())) m[r][at + t] = s->mask[t];
      }
      at += L;
    }
  }
  return b;
}

PackedRows PackSeqs(const std::vector<Seq>& seqs, int64_t begin, int64_t end, int64_t row_len) {
  std::vector<int64_t> order;
  for (int64_t i = begin; i < end; ++i) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return seqs[x].ids.size() > seqs[y].ids.size(); });
  std::vector<std::vector<const Seq*>> rows;
  std::vector<int64_t> used;
  // Where each sequence went: row and offset.
  std::vector<std::pair<int64_t, int64_t>> place(end - begin);
  for (int64_t i : order) {
    const int64_t L = seqs[i].ids.size();
    size_t r = 0;
    while (r < rows.size() && used[r] + L > row_len) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      used.push_back(0);
    }
    place[i - begin] = {static_cast<int64_t>(r), used[r]};
    rows[r].push_back(&seqs[i]);
    used[r] += L;
  }
  PackedRows p;
  std::vector<int64_t> row_lengths;
  p.batch = MakeRowsBatch(rows, &row_lengths);
  p.seqs = end - begin;
  p.row_len = row_len;
  const int64_t W = p.batch.input_ids.size(1), zero_slot = static_cast<int64_t>(rows.size()) * W;
  p.gather = at::full({p.seqs * row_len}, zero_slot, at::kLong);
  auto g = p.gather.accessor<int64_t, 1>();
  for (int64_t i = 0; i < p.seqs; ++i) {
    const auto [r, offset] = place[i];
    const int64_t L = seqs[begin + i].ids.size();
    for (int64_t t = 0; t < L; ++t) g[i * row_len + t] = r * W + offset + t;
  }
  return p;
}

at::Tensor PackedRows::Unpack(const at::Tensor& packed) const {
  const at::Tensor flat = at::cat({packed.reshape({-1}), at::zeros({1}, packed.options())});
  return flat.index_select(0, gather.to(packed.device())).view({seqs, row_len});
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

std::vector<std::pair<int64_t, int64_t>> MicroBatches(const std::vector<int64_t>& lengths,
                                                      int64_t begin, int64_t end,
                                                      int64_t max_tokens) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = begin, longest = 0;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t l = std::max<int64_t>(longest, lengths[r]);
    if (r > start && (r - start + 1) * l > max_tokens) {
      out.emplace_back(start, r);
      start = r;
      longest = lengths[r];
    } else {
      longest = l;
    }
  }
  if (end > start) out.emplace_back(start, end);
  return out;
}

}  // namespace rlmesh::learner
