#pragma once

// LibTorch's intra-op threads, for a process's main() without the model's
// headers.

namespace rlmesh::actor {

// Sets LibTorch's intra-op threads; n <= 0 means all hardware threads.
// LibTorch defaults to 1 on the 2-core machines, so every process calls this.
void ConfigureThreads(int n);

}  // namespace rlmesh::actor
