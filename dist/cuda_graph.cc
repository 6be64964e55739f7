#include "dist/cuda_graph.h"

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "dist/cuda_shim.h"

namespace rlmesh::dist {
namespace {

// The shim's entry points (dist/torch_cuda_shim.cc).
struct Api {
  void* (*make)(char*, size_t);
  int (*capture)(void*, int, int (*)(void*, int), void*, char*, size_t);
  int (*replay)(void*, char*, size_t);
  void (*free)(void*);
};

absl::StatusOr<Api> LoadApi() {
  RLMESH_ASSIGN_OR_RETURN(void* make, TorchCudaShimSymbol("rlmesh_cuda_graph_new"));
  RLMESH_ASSIGN_OR_RETURN(void* capture, TorchCudaShimSymbol("rlmesh_cuda_graph_capture"));
  RLMESH_ASSIGN_OR_RETURN(void* replay, TorchCudaShimSymbol("rlmesh_cuda_graph_replay"));
  RLMESH_ASSIGN_OR_RETURN(void* free, TorchCudaShimSymbol("rlmesh_cuda_graph_free"));
  Api api;
  api.make = reinterpret_cast<decltype(api.make)>(make);
  api.capture = reinterpret_cast<decltype(api.capture)>(capture);
  api.replay = reinterpret_cast<decltype(api.replay)>(replay);
  api.free = reinterpret_cast<decltype(api.free)>(free);
  return api;
}

// What the shim calls back: the caller's function, and its exception's
// message (exceptions do not cross the C entry point).
struct RunContext {
  const std::function<void(bool)>* run;
  std::string failed;
};

int Trampoline(void* ctx, int capturing) {
  auto* c = static_cast<RunContext*>(ctx);
  try {
    (*c->run)(capturing != 0);
    return 0;
  } catch (const c10::Error& e) {
    c->failed = e.what_without_backtrace();
  } catch (const std::exception& e) {
    c->failed = e.what();
  }
  if (c->failed.empty()) c->failed = "failed";
  return 1;
}

const absl::StatusOr<Api>& GraphApi() {
  static const auto* api = new absl::StatusOr<Api>(LoadApi());
  return *api;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaGraph>> CudaGraph::Capture(int device, const std::function<void(bool)>& run) {
  const absl::StatusOr<Api>& api = GraphApi();
  if (!api.ok()) return absl::FailedPreconditionError(absl::StrCat("CUDA graph: ", api.status().message()));
  char error[1024] = {0};
  void* made = api->make(error, sizeof(error));
  if (made == nullptr) return absl::InternalError(absl::StrCat("CUDA graph capture on cuda:", device, ": ", error));
  std::unique_ptr<CudaGraph> graph(new CudaGraph(made));
  RunContext ctx{&run, ""};
  const int rc = api->capture(graph->graph_, device, &Trampoline, &ctx, error, sizeof(error));
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("CUDA graph capture on cuda:", device, ": ", rc == 2 ? ctx.failed : std::string(error)));
  }
  return graph;
}

CudaGraph::~CudaGraph() {
  if (graph_ != nullptr && GraphApi().ok()) GraphApi()->free(graph_);
}

absl::Status CudaGraph::Replay() {
  char error[1024] = {0};
  if (GraphApi()->replay(graph_, error, sizeof(error)) != 0) {
    return absl::InternalError(absl::StrCat("CUDA graph replay: ", error));
  }
  return absl::OkStatus();
}

}  // namespace rlmesh::dist
