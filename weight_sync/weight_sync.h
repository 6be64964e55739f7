#pragma once

// Weight sync: how the learner's rank 0 (publisher) hands a new policy
// version to rollout workers (receivers). Named tensors (Hugging Face names)
// are flattened into buckets of spec.bucket_mb; a WeightLayout (version,
// bucket sizes, every tensor's name/shape/dtype/offset) describes them.
//
// Backends, chosen by WeightSyncSpec.backend (the caller never needs to know
// which one runs):
//   SHM         two slots of bucket files under /dev/shm (spec.shm_prefix),
//               reused across versions (v goes to slot v % 2), a seqlock word
//               per slot and a layout manifest per version written last;
//               receivers memcpy out. Same host. Publish returns once the
//               data is in place; the newest two versions stay readable, and
//               a reader overtaken by the publisher gets ABORTED, never torn
//               data.
//   GLOO        c10d ProcessGroupGloo broadcast from rank 0 over a TCPStore
//               at spec.store_host:store_port (hosted by the coordinator, or
//               by WeightSyncStore below). The layout travels in-band first,
//               then the buckets one by one through two buffers: the
//               publisher packs the next bucket while one is on the wire,
//               and a receiver unpacks one while the next arrives, so
//               neither side holds more than two buckets besides the
//               tensors. Publish and Receive are collectives: every rank
//               must call them for the same version at the same time.
//   NCCL        ncclBroadcast from rank 0, one rank per GPU (each on its
//               own spec.device, CudaDeviceOf), same wire order, pipelining and
//               collective contract as GLOO; rank 0's ncclUniqueId goes
//               through the same TCPStore. The buckets are device tensors on
//               the rank's GPU, broadcast in place: the publisher copies its
//               tensors (from any device) into them and receivers get
//               tensors on their GPU, with no staging through host memory.
//   CUDA_IPC    learner and worker on one host (typically one GPU, where
//               NCCL refuses two ranks): the publisher keeps two slots of
//               device buckets and shares cudaIpcMemHandle_t's through a
//               manifest under spec.shm_prefix ("ipc-seq", "ipc-v<N>");
//               receivers open them once and copy device -> device into
//               tensors on that GPU (the publisher's GPU tensors are copied
//               device -> device too: nothing crosses the host). Same
//               publish-first, newest-two-versions and ABORTED-when-
//               overtaken semantics as SHM.
//   IN_PROCESS  a process-wide table keyed by spec.group_name (tests).
//   The GPU backends load libcudart/libnccl with dlopen: every binary builds
//   and starts without them, and creating an NCCL or CUDA_IPC publisher or
//   receiver where a library or a device is missing returns
//   FAILED_PRECONDITION naming it ("NCCL backend: libnccl.so.2 not found
//   (dlopen: ...)", "CUDA_IPC backend: no CUDA device (...)").
//   AUTO        SHM when spec.store_host is loopback (one host), else GLOO.
//
// Between tensor-parallel layouts the weights travel in pieces
// (spec.pieces, weight_sync/pieces.h): each piece is a group of its own
// with its own publisher (the learner rank that holds it) and a receiver in
// every worker; nothing here knows what a piece holds.
//
// How a caller uses it, whatever the backend: the learner calls
// Publish(tensors, V) and the workers call Receive(layout) with at least
// layout.version = V; doing both concurrently always works, and for SHM and
// IN_PROCESS publishing first and receiving afterwards works too (a receiver
// waits up to spec.timeout_ms for version V to appear). When `expected`
// carries tensors, the received layout must equal it. The receiving side
// checks every bucket size and every tensor's dtype, shape and bounds
// against the layout before returning anything.
//
// Errors: bad spec or tensors -> INVALID_ARGUMENT naming the field; a GPU
// backend without its library or a device -> FAILED_PRECONDITION;
// version not newer -> INVALID_ARGUMENT ("version"); nothing arrived within
// timeout_ms -> DEADLINE_EXCEEDED; a failed collective -> ABORTED, after
// which the object is unusable (FAILED_PRECONDITION) and must be recreated
// with a new spec.group_name.
//
// Thread-safety: one thread uses a publisher or receiver at a time.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/common.pb.h"

namespace rlmesh::weight_sync {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Defaults applied to a zero field of WeightSyncSpec.
inline constexpr int64_t kDefaultWeightSyncTimeoutMs = 60'000;
inline constexpr int kDefaultBucketMb = 64;
// Offset alignment of every tensor inside its bucket, bytes.
inline constexpr int64_t kSlotAlignment = 64;

// Largest spec.timeout_ms accepted: an hour.
inline constexpr int64_t kMaxWeightSyncTimeoutMs = 3'600'000;

// Largest spec.pieces accepted.
inline constexpr int kMaxWeightPieces = 4096;

// INVALID_ARGUMENT naming the field for a spec that cannot work
// (world_size/rank out of range for GLOO/NCCL, a timeout outside [0, an
// hour], a negative bucket size, GLOO/NCCL without store host/port).
absl::Status ValidateSpec(const WeightSyncSpec& spec);

// The backend AUTO resolves to for `spec` (SHM for a loopback or empty
// store_host, GLOO otherwise); other backends map to themselves.
WeightSyncBackend ResolveBackend(const WeightSyncSpec& spec);

// Element type name used in TensorSlot.dtype ("f32", "bf16", "f16") and back.
absl::StatusOr<std::string> DtypeName(const at::Tensor& t);

// `tensors` with every floating-point tensor of another type cast to
// `dtype` ("f32", "bf16", "f16"; "" = unchanged), on its own device; others
// are shared, not copied. What a publisher with spec.dtype sends.
absl::StatusOr<NamedTensors> CastForSync(const NamedTensors& tensors, const std::string& dtype);

// Packs `tensors` in order into buckets of at most `bucket_bytes` (a larger
// tensor gets a bucket of its own), offsets aligned to kSlotAlignment.
// INVALID_ARGUMENT for an empty list, an empty or duplicate name, or an
// unsupported dtype.
absl::StatusOr<WeightLayout> BuildLayout(const NamedTensors& tensors, int64_t version,
                                         int64_t bucket_bytes);

// Checks a layout on its own: known dtypes, each slot inside its bucket,
// no duplicate names. INVALID_ARGUMENT naming the tensor.
absl::Status ValidateLayout(const WeightLayout& layout);

// Sends versions of the weights. Created on the learner's rank 0.
class WeightPublisher {
 public:
  virtual ~WeightPublisher() = default;
  // Publishes `tensors` (any device; fp32/bf16/f16) as `version`, which must
  // exceed every version published before; with spec.dtype set, floating
  // tensors go as that type (CastForSync). Returns the layout sent.
  virtual absl::StatusOr<WeightLayout> Publish(const NamedTensors& tensors, int64_t version) = 0;
  // The backend actually used (AUTO resolved).
  virtual WeightSyncBackend backend() const = 0;
};

// Receives versions of the weights. Created on each rollout worker.
class WeightReceiver {
 public:
  virtual ~WeightReceiver() = default;
  // Receives version expected.version (> 0). Tensors come back in layout
  // order, with the layout's dtypes and shapes, on the CPU (NCCL: on the
  // rank's GPU; CUDA_IPC: on the publisher's GPU). If `received` is
  // non-null it gets the layout that arrived.
  virtual absl::StatusOr<NamedTensors> Receive(const WeightLayout& expected,
                                               WeightLayout* received = nullptr) = 0;
  // Same, but copies into caller-owned tensors (matched by name; each a
  // contiguous tensor of the slot's dtype and shape, one per slot, on the
  // device Receive would return them on).
  // Reusing the same destinations every version avoids touching fresh
  // memory: this is the fast path (SHM copies straight from the segment).
  // On error the destinations may be partly written.
  virtual absl::Status ReceiveInto(const WeightLayout& expected, const NamedTensors& destinations,
                                   WeightLayout* received = nullptr);
  virtual WeightSyncBackend backend() const = 0;
};

// REQUIRES for GLOO/NCCL: spec.rank == 0. Fails fast on a bad spec or a
// missing GPU library/device; a GLOO or NCCL group is formed lazily by the
// first Publish (which waits for every receiver).
absl::StatusOr<std::unique_ptr<WeightPublisher>> CreateWeightPublisher(const WeightSyncSpec& spec);

// REQUIRES for GLOO/NCCL: 1 <= spec.rank < spec.world_size.
absl::StatusOr<std::unique_ptr<WeightReceiver>> CreateWeightReceiver(const WeightSyncSpec& spec);

// A c10d TCPStore server for a GLOO group (what the coordinator hosts; tests
// and benchmarks host their own). Every rank of the group connects to it as a
// client. Safe to destroy while nobody uses the group.
class WeightSyncStore {
 public:
  // Binds host:port (0 = a free port).
  static absl::StatusOr<std::unique_ptr<WeightSyncStore>> Host(const std::string& host, int port,
                                                              int world_size, int64_t timeout_ms);
  ~WeightSyncStore();
  int port() const { return port_; }

 private:
  struct Impl;
  WeightSyncStore(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  int port_;
};

// The CUDA device index a process joins NCCL or CUDA IPC with: its own
// (spec.device), never one derived from its rank. FAILED_PRECONDITION
// naming the rank when spec.device is empty, a CPU, or not among the
// `visible_devices` this process sees.
absl::StatusOr<int> CudaDeviceOf(const WeightSyncSpec& spec, int visible_devices);

}  // namespace rlmesh::weight_sync
