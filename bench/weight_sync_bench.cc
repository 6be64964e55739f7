// Weight-sync hand-off between two processes on this host (not a test):
// the publisher in this process, one receiver in a child, through the
// public weight_sync API only, so that bench/weight_sync_ab.py can build
// this same file against an older weight_sync and compare. With
// --backend=cuda_ipc --device=cuda (scripts/device_check.sh) the tensors are
// on the GPU and the reference is a device-to-device copy of them.
//
// Each round: the child resets its peak resident set and calls Receive
// (round 1) or ReceiveInto its round-1 tensors (later rounds, as the rollout
// worker does); this process resets its own and calls Publish. Round 1 is
// start-up and is left out of the times. The last line of stdout is JSON:
//   {"backend", "device", "bytes", "handoff_s": [...], "publish_s": [...],
//    "copy_s": [...], "publisher_peak_bytes": [...],
//    "receiver_peak_bytes": [...], "receiver_first_peak_bytes"}
// where *_peak_bytes is the peak resident set (host memory) above the one at
// the round's start, handoff_s runs from Publish's start to the child's
// return, and copy_s is the reference: one copy of the same tensors into
// tensors already allocated on the same device, in this process.
//
//   bazel run -c opt //bench:weight_sync_bench -- --backend=gloo --sync_mb=512
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench/process_memory.h"
#include "dist/device.h"
#include "common/subprocess.h"
#include "weight_sync/weight_sync.h"

ABSL_FLAG(std::string, backend, "gloo", "gloo, shm or cuda_ipc.");
ABSL_FLAG(std::string, device, "cpu", "Where the published tensors are: cpu or cuda[:i].");
ABSL_FLAG(int, sync_mb, 512, "Weight bytes per round, MiB.");
ABSL_FLAG(int, tensor_mb, 8, "Size of each fp32 tensor, MiB (the last may be smaller).");
ABSL_FLAG(int, bucket_mb, 0, "spec.bucket_mb (0: the default).");
ABSL_FLAG(int, rounds, 4, "Rounds, the first one not timed.");
ABSL_FLAG(int, threads, 2, "LibTorch intra-op threads.");
// Child-process role (internal).
ABSL_FLAG(std::string, role, "", "internal: 'recv' runs the receiving side.");
ABSL_FLAG(int, store_port, 0, "internal: Gloo store port.");
ABSL_FLAG(std::string, prefix, "", "internal: shm prefix.");
ABSL_FLAG(std::string, out, "", "internal: the receiver's result file.");

namespace rlmesh::weight_sync {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "weight_sync_bench: %s\n", s.ToString().c_str());
  return 1;
}

WeightSyncSpec Spec(int port, int rank, const std::string& prefix) {
  WeightSyncSpec spec;
  const std::string backend = absl::GetFlag(FLAGS_backend);
  spec.set_backend(backend == "shm"        ? WEIGHT_SYNC_SHM
                   : backend == "cuda_ipc" ? WEIGHT_SYNC_CUDA_IPC
                                           : WEIGHT_SYNC_GLOO);
  spec.set_store_host("127.0.0.1");
  spec.set_store_port(port);
  spec.set_world_size(2);
  spec.set_rank(rank);
  spec.set_group_name("bench");
  spec.set_timeout_ms(300000);
  spec.set_shm_prefix(prefix);
  spec.set_bucket_mb(absl::GetFlag(FLAGS_bucket_mb));
  if (backend == "cuda_ipc") spec.set_device(absl::GetFlag(FLAGS_device));
  return spec;
}

// Child: receives every round; appends "version end_micros peak_bytes".
int Receiver() {
  auto recv = CreateWeightReceiver(Spec(absl::GetFlag(FLAGS_store_port), 1, absl::GetFlag(FLAGS_prefix)));
  if (!recv.ok()) return Fail(recv.status());
  NamedTensors tensors;
  for (int v = 1; v <= absl::GetFlag(FLAGS_rounds); ++v) {
    if (!bench::ResetPeakRss()) return Fail(absl::InternalError("cannot reset the peak resident set"));
    const double before = bench::RssBytes();
    WeightLayout want;
    want.set_version(v);
    if (tensors.empty()) {
      auto got = (*recv)->Receive(want);
      if (!got.ok()) return Fail(got.status());
      tensors = *std::move(got);
    } else if (absl::Status s = (*recv)->ReceiveInto(want, tensors); !s.ok()) {
      return Fail(s);
    }
    const int64_t end = absl::ToUnixMicros(absl::Now());
    std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::app);
    out << v << " " << end << " " << static_cast<int64_t>(bench::PeakRssBytes() - before) << "\n";
  }
  return 0;
}

struct ReceiverLine {
  int64_t end_micros = 0;
  int64_t peak_bytes = 0;
};

std::vector<ReceiverLine> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<ReceiverLine> lines;
  int64_t v, end, peak;
  while (in >> v >> end >> peak) lines.push_back({end, peak});
  return lines;
}

void Synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

int Publisher(const std::string& dir) {
  const int64_t total = static_cast<int64_t>(absl::GetFlag(FLAGS_sync_mb)) << 20;
  const int64_t per = static_cast<int64_t>(absl::GetFlag(FLAGS_tensor_mb)) << 20;
  const int rounds = absl::GetFlag(FLAGS_rounds);
  auto device = dist::ResolveDevice(absl::GetFlag(FLAGS_device), "weight_sync_bench --device");
  if (!device.ok()) return Fail(device.status());
  NamedTensors tensors, copies;
  for (int64_t done = 0, i = 0; done < total; done += per, ++i) {
    tensors.emplace_back(absl::StrCat("w", i), at::randn({std::min(per, total - done) / 4}, at::Device(*device)));
    copies.emplace_back(tensors.back().first, at::empty_like(tensors.back().second));
  }
  // The reference, once per round: a copy of the same tensors on their device.
  std::vector<double> copy;
  for (int r = 0; r < rounds; ++r) {
    Synchronize(*device);
    const absl::Time t0 = absl::Now();
    for (size_t i = 0; i < tensors.size(); ++i) copies[i].second.copy_(tensors[i].second);
    Synchronize(*device);
    if (r > 0) copy.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  copies.clear();
  const std::string out = dir + "/recv.lines";
  const std::string prefix = absl::StrCat("/dev/shm/rlmesh-wsbench-", getpid(), "-");
  std::unique_ptr<WeightSyncStore> store;
  int port = 0;
  if (absl::GetFlag(FLAGS_backend) == "gloo") {
    auto s = WeightSyncStore::Host("127.0.0.1", 0, 2, 300000);
    if (!s.ok()) return Fail(s.status());
    store = std::move(*s);
    port = store->port();
  }
  auto child = Subprocess::Start({"/proc/self/exe", "--role=recv", "--backend=" + absl::GetFlag(FLAGS_backend),
                                  "--device=" + absl::GetFlag(FLAGS_device),
                                  absl::StrCat("--store_port=", port), "--prefix=" + prefix, "--out=" + out,
                                  absl::StrCat("--rounds=", rounds),
                                  absl::StrCat("--bucket_mb=", absl::GetFlag(FLAGS_bucket_mb)),
                                  absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads))});
  if (!child.ok()) return Fail(child.status());
  auto pub = CreateWeightPublisher(Spec(port, 0, prefix));
  if (!pub.ok()) return Fail(pub.status());
  std::vector<double> handoff, publish, pub_peak, recv_peak;
  int64_t recv_first_peak = 0;
  for (int v = 1; v <= rounds; ++v) {
    if (!bench::ResetPeakRss()) return Fail(absl::InternalError("cannot reset the peak resident set"));
    const double before = bench::RssBytes();
    const int64_t start = absl::ToUnixMicros(absl::Now());
    auto layout = (*pub)->Publish(tensors, v);
    if (!layout.ok()) return Fail(layout.status());
    const double publish_s = (absl::ToUnixMicros(absl::Now()) - start) * 1e-6;
    const double peak = bench::PeakRssBytes() - before;
    // SHM's Publish does not wait for the receiver: wait for its line.
    const absl::Time deadline = absl::Now() + absl::Seconds(300);
    std::vector<ReceiverLine> lines;
    while ((lines = ReadLines(out)).size() < static_cast<size_t>(v) && absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(200));
    }
    if (lines.size() < static_cast<size_t>(v)) return Fail(absl::DeadlineExceededError("receiver did not finish"));
    if (v == 1) {
      recv_first_peak = lines[0].peak_bytes;
      continue;
    }
    handoff.push_back((lines[v - 1].end_micros - start) * 1e-6);
    publish.push_back(publish_s);
    pub_peak.push_back(peak);
    recv_peak.push_back(static_cast<double>(lines[v - 1].peak_bytes));
  }
  auto st = child->Wait(absl::Seconds(60));
  if (!st.ok()) return Fail(st.status());
  auto list = [](const std::vector<double>& v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); };
  std::printf("{\"backend\": \"%s\", \"device\": \"%s\", \"bytes\": %lld, \"handoff_s\": %s, "
              "\"publish_s\": %s, \"copy_s\": %s, \"publisher_peak_bytes\": %s, \"receiver_peak_bytes\": %s, "
              "\"receiver_first_peak_bytes\": %lld}\n",
              absl::GetFlag(FLAGS_backend).c_str(), device->str().c_str(), static_cast<long long>(total),
              list(handoff).c_str(), list(publish).c_str(), list(copy).c_str(), list(pub_peak).c_str(),
              list(recv_peak).c_str(), static_cast<long long>(recv_first_peak));
  return 0;
}

}  // namespace
}  // namespace rlmesh::weight_sync

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  at::set_num_threads(absl::GetFlag(FLAGS_threads));
  if (absl::GetFlag(FLAGS_role) == "recv") return rlmesh::weight_sync::Receiver();
  char tmpl[] = "/tmp/weight_sync_bench_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  const int rc = rlmesh::weight_sync::Publisher(dir);
  std::remove((dir + "/recv.lines").c_str());
  rmdir(dir.c_str());
  return rc;
}
