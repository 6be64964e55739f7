#pragma once
// The decode step at fixed shapes, which is what a CUDA graph can replay
// (GeneratorOptions::static_decode and cuda_graphs). The live rows are
// padded to a bucket (the next power of two, at most max_batch) and attend
// over the KV cache's whole capacity, masked past each row's length, so the
// step's shapes change only when the bucket or the cache does. Inputs go
// through buffers that keep their addresses. With CUDA graphs, each bucket's
// step is captured on its first use on a cache and replayed after that; a
// new cache (grown, or rebuilt after every row finished) drops the graphs.
//
// Padding rows decode token 0 at position 0 of cache rows no live row uses:
// finite values a later prefill overwrites. Masked positions count as 0 in
// the attention (the cache is zeroed where nothing was written), so a row's
// output equals the dynamic step's up to the order of the sums.
//
// Not thread-safe: the Generator's thread only.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actor/generate.h"
#include "dist/cuda_graph.h"

namespace rlmesh::actor {

class FixedShapeDecoder {
 public:
  // `cuda_graphs`: capture and replay (the model must be on a GPU).
  FixedShapeDecoder(int64_t max_batch, bool cuda_graphs, c10::Device device);

  // Rows a step of n live rows decodes: the next power of two >= n, at most
  // max_batch.
  int64_t Bucket(int64_t n) const;

  // Final hidden states [n, H] of one decode step of the n live rows (the
  // token each feeds, `ids`, at position `lens`), through rows
  // [0, Bucket(n)) of `cache`, which must hold that many. Throws what the
  // model throws, and c10::Error naming rollout.cuda_graphs when a graph
  // cannot be captured (graph_error keeps why): asked for graphs, decoding
  // never goes on without them.
  at::Tensor Step(GenerationModel& model, const KvCache& cache, const std::vector<int64_t>& ids,
                  const std::vector<int64_t>& lens);

  // Graphs captured and replayed so far.
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  // Why a capture failed ("" while graphs work or are off).
  const std::string& graph_error() const { return graph_error_; }

 private:
  struct Captured {
    std::unique_ptr<dist::CudaGraph> graph;
    at::Tensor hidden;  // [bucket, H], rewritten by each replay
  };
  // Every cache tensor's address, and the capacity: what a graph baked in.
  static std::vector<const void*> Addresses(const KvCache& cache);

  const int64_t max_batch_;
  bool graphs_;
  c10::Device device_;
  at::Tensor ids_, lens_;  // [max_batch] int64 on the device
  std::map<int64_t, Captured> by_bucket_;
  std::vector<const void*> captured_on_;
  int64_t captures_ = 0, replays_ = 0;
  std::string graph_error_;
};

}  // namespace rlmesh::actor
