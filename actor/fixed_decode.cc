#include "actor/fixed_decode.h"

#include <algorithm>
#include <utility>

#include <ATen/ATen.h>

#include "actor/transformer.h"
#include "common/log.h"

namespace rlmesh::actor {

FixedShapeDecoder::FixedShapeDecoder(int64_t max_batch, bool cuda_graphs, c10::Device device)
    : max_batch_(max_batch), graphs_(cuda_graphs), device_(device) {}

int64_t FixedShapeDecoder::Bucket(int64_t n) const {
  int64_t b = 1;
  while (b < n) b *= 2;
  return std::min(b, max_batch_);
}

std::vector<const void*> FixedShapeDecoder::Addresses(const KvCache& cache) {
  std::vector<const void*> out;
  for (size_t i = 0; i < cache.k.size(); ++i) {
    out.push_back(cache.k[i].data_ptr());
    out.push_back(cache.v[i].data_ptr());
  }
  out.push_back(reinterpret_cast<const void*>(cache.capacity()));
  out.push_back(reinterpret_cast<const void*>(cache.rows()));
  return out;
}

at::Tensor FixedShapeDecoder::Step(GenerationModel& model, const KvCache& cache, const std::vector<int64_t>& ids,
                                      const std::vector<int64_t>& lens) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t bucket = Bucket(n);
  TORCH_CHECK(cache.rows() >= bucket, "FixedShapeDecoder: the cache holds ", cache.rows(), " rows, the step needs ",
              bucket);
  if (!ids_.defined()) {
    ids_ = at::zeros({max_batch_}, at::TensorOptions(at::kLong).device(device_));
    lens_ = at::zeros_like(ids_);
  }
  std::vector<int64_t> padded_ids(bucket, 0), padded_lens(bucket, 0);
  std::copy(ids.begin(), ids.end(), padded_ids.begin());
  std::copy(lens.begin(), lens.end(), padded_lens.begin());
  ids_.narrow(0, 0, bucket).copy_(at::from_blob(padded_ids.data(), {bucket}, at::kLong));
  lens_.narrow(0, 0, bucket).copy_(at::from_blob(padded_lens.data(), {bucket}, at::kLong));
  const int64_t capacity = cache.capacity();
  auto run = [&, bucket, capacity] {
    KvCache rows = cache.FirstRows(bucket);
    return model.DecodeStep(ids_.narrow(0, 0, bucket), lens_.narrow(0, 0, bucket), capacity - 1, &rows);
  };
  if (!graphs_) return run().narrow(0, 0, n);

  std::vector<const void*> on = Addresses(cache);
  if (on != captured_on_) {
    by_bucket_.clear();
    captured_on_ = std::move(on);
  }
  auto it = by_bucket_.find(bucket);
  if (it != by_bucket_.end()) {
    const absl::Status replayed = it->second.graph->Replay();
    TORCH_CHECK(replayed.ok(), replayed.ToString());
    ++replays_;
    return it->second.hidden.narrow(0, 0, n);
  }
  // The bucket's first step on this cache runs for real while the graph is
  // made (its result is this step's), then the graph is recorded.
  at::Tensor out;
  Captured c;
  auto graph = dist::CudaGraph::Capture(device_.has_index() ? device_.index() : 0, [&](bool capturing) {
    (capturing ? c.hidden : out) = run();
  });
  if (!graph.ok()) {
    // Asked for graphs, the run gets graphs or fails: decoding on eagerly
    // would pass a GPU check with the feature off.
    graph_error_ = graph.status().ToString();
    by_bucket_.clear();
    TORCH_CHECK(false, "rollout.cuda_graphs: capturing the decode step of ", bucket, " rows on ", device_.str(),
                " failed: ", graph_error_);
  }
  c.graph = std::move(*graph);
  ++captures_;
  by_bucket_.emplace(bucket, std::move(c));
  return out.narrow(0, 0, n);
}

}  // namespace rlmesh::actor
