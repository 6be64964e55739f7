// dist::CudaGraph on a machine without a GPU: the shim loads, its entry
// points resolve, and a capture fails in LibTorch's words without running
// the caller's code or crashing. (The graphs run in
// actor/fixed_decode_gpu_test on a GPU.)
#include "dist/cuda_graph.h"

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "dist/cuda_shim.h"
#include "dist/device.h"
#include "dist/testing/require_gpus.h"
#include "dist/torch_cuda.h"

namespace rlmesh::dist {
namespace {

TEST_CASE("Without a GPU a capture is refused in LibTorch's words, the shim's entry points resolved") {
  if (testing::GpuVisible("actor/fixed_decode_gpu_test")) return;
  for (const char* symbol : {"rlmesh_cuda_graph_new", "rlmesh_cuda_graph_capture", "rlmesh_cuda_graph_replay",
                             "rlmesh_cuda_graph_free", "rlmesh_new_nccl_backend", "rlmesh_cuda_current_stream",
                             "rlmesh_cuda_base_allocation"}) {
    INFO(symbol);
    CHECK(TorchCudaShimSymbol(symbol).ok());
  }
  CHECK(TorchCudaShimSymbol("rlmesh_no_such_entry").status().code() == absl::StatusCode::kFailedPrecondition);
  // The stream and segment queries answer with LibTorch's error, not a crash.
  auto stream = TorchCurrentStream(0);
  CHECK(stream.status().code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(stream.status().message(), "LibTorch's current stream on cuda:0: "));
  int host = 0;
  CHECK(CachingAllocatorSegment(&host).status().code() == absl::StatusCode::kInternal);
  int runs = 0;
  auto graph = CudaGraph::Capture(0, [&](bool) { ++runs; });
  INFO(graph.status().ToString());
  REQUIRE(graph.status().code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(graph.status().message(), "CUDA graph capture on cuda:0: "));
  CHECK(runs == 0);
}

}  // namespace
}  // namespace rlmesh::dist
