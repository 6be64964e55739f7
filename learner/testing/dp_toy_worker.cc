// One rank of the two-process data-parallel test: trains the toy problem
// over a TCPStore + Gloo group and writes its final parameters (raw float32)
// to --out. Rank 0 hosts the store on a free port and writes it to
// --port_file; other ranks connect to --port.
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/atomic_file.h"
#include "dist/gloo.h"
#include "dist/store.h"
#include "learner/data_parallel.h"
#include "learner/testing/dp_toy.h"

ABSL_FLAG(int, rank, 0, "this rank");
ABSL_FLAG(int, world, 2, "number of ranks");
ABSL_FLAG(int, port, 0, "TCPStore port (ranks > 0)");
ABSL_FLAG(std::string, port_file, "", "rank 0 writes the store's port here");
ABSL_FLAG(bool, zero1, false, "ZeRO-1 instead of plain data parallel");
ABSL_FLAG(std::string, out, "", "write the final flat parameters here");

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "dp_toy_worker: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rank = absl::GetFlag(FLAGS_rank);
  const int world = absl::GetFlag(FLAGS_world);
  constexpr int64_t kTimeoutMs = 60'000;
  auto store = rlmesh::dist::MakeTcpStore("127.0.0.1", absl::GetFlag(FLAGS_port), rank == 0,
                                             world, kTimeoutMs);
  if (!store.ok()) return Fail(store.status().ToString());
  if (rank == 0) {
    const absl::Status written = rlmesh::WriteFileAtomically(absl::GetFlag(FLAGS_port_file),
                                                             std::to_string((*store)->getPort()) + "\n");
    if (!written.ok()) return Fail(written.ToString());
  }
  rlmesh::dist::GlooGroupOptions gloo;
  gloo.timeout_ms = kTimeoutMs;
  auto group = rlmesh::dist::CreateGlooGroup(*store, rank, world, gloo);
  if (!group.ok()) return Fail(group.status().ToString());
  rlmesh::learner::testing::ToyTrainOptions options;
  options.dp.zero1 = absl::GetFlag(FLAGS_zero1);
  // Each rank starts from different weights; the broadcast must fix that.
  auto flat = rlmesh::learner::testing::TrainToy(*group, options, /*init_seed=*/100 + rank);
  if (!flat.ok()) return Fail(flat.status().ToString());
  at::Tensor values = flat->contiguous();
  std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::binary);
  out.write(static_cast<const char*>(values.data_ptr()), values.numel() * sizeof(float));
  if (!out.good()) return Fail("cannot write --out");
  return 0;
}
