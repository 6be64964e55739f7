#pragma once

// Helpers shared by the weight-sync tests (CPU: weight_sync_test, GPU:
// weight_sync_gpu_test): test tensors, a bit-exact comparison, and specs.

#include <ATen/ATen.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "weight_sync/weight_sync.h"

namespace rlmesh::weight_sync {

// Mixed dtypes and sizes; one tensor (big) is larger than a 1 MiB bucket.
inline NamedTensors MakeTensors(int seed) {
  at::manual_seed(seed);
  return {
      {"model.embed_tokens.weight", at::randn({64, 32})},
      {"model.layers.0.self_attn.q_proj.weight", at::randn({32, 32}).to(at::kBFloat16)},
      {"model.norm.weight", at::randn({7}).to(at::kHalf)},
      {"big", at::randn({300, 1024})},  // 1.2 MB
      {"lm_head.weight", at::randn({64, 32}).t()},  // non-contiguous
      {"scalar", at::randn({})},
  };
}

inline void ExpectBitExact(const NamedTensors& sent, const NamedTensors& got) {
  REQUIRE(got.size() == sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    INFO(sent[i].first);
    CHECK(got[i].first == sent[i].first);
    CHECK(got[i].second.scalar_type() == sent[i].second.scalar_type());
    CHECK(got[i].second.sizes() == sent[i].second.sizes());
    // Bit-exact: compare the raw bytes, not values with a tolerance (on
    // the host, wherever the tensors are).
    at::Tensor a = sent[i].second.to(at::kCPU).contiguous();
    at::Tensor b = got[i].second.to(at::kCPU).contiguous();
    REQUIRE(a.nbytes() == b.nbytes());
    CHECK(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
  }
}

inline WeightSyncSpec ShmSpec(const testing::TempDir& dir) {
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_SHM);
  spec.set_shm_prefix(dir.File("w-"));
  spec.set_bucket_mb(1);
  spec.set_timeout_ms(2000);
  return spec;
}

// GPU backends: specs for the NCCL and CUDA_IPC tests.

inline WeightSyncSpec NcclSpec(int port, int rank) {
  WeightSyncSpec spec;
  spec.set_backend(WEIGHT_SYNC_NCCL);
  spec.set_store_host("127.0.0.1");
  spec.set_store_port(port);
  spec.set_world_size(2);
  spec.set_rank(rank);
  spec.set_group_name("ws-test-nccl");
  spec.set_timeout_ms(30000);
  spec.set_bucket_mb(1);
  spec.set_device("cuda");
  return spec;
}

inline WeightSyncSpec IpcSpec(const testing::TempDir& dir) {
  WeightSyncSpec spec = ShmSpec(dir);
  spec.set_backend(WEIGHT_SYNC_CUDA_IPC);
  spec.set_timeout_ms(10000);
  spec.set_device("cuda");
  return spec;
}

inline bool NamesWhatIsMissing(const absl::Status& s) {
  return absl::StrContains(s.message(), " not found (dlopen: ") || absl::StrContains(s.message(), "no CUDA device");
}

}  // namespace rlmesh::weight_sync
