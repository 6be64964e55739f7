#pragma once

// Pieces the weight-sync backends share (not part of the API): layout
// packing and checks, CUDA ordering by events, the collective
// channel GLOO and NCCL implement, and one constructor per backend for
// factory.cc. Everything here is in namespace weight_sync::internal.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "dist/cuda_api.h"
#include "weight_sync/weight_sync.h"

namespace c10d {
class Store;
}  // namespace c10d

namespace rlmesh::weight_sync::internal {

using dist::CudaDeviceCount;
using dist::CudaRuntimeApi;
using dist::LoadCudaRuntime;
using dist::LoadNccl;
using dist::NcclApi;

inline int64_t TimeoutMs(const WeightSyncSpec& spec) {
  return spec.timeout_ms() > 0 ? spec.timeout_ms() : kDefaultWeightSyncTimeoutMs;
}

inline int64_t BucketBytes(const WeightSyncSpec& spec) {
  return static_cast<int64_t>(spec.bucket_mb() > 0 ? spec.bucket_mb() : kDefaultBucketMb) << 20;
}

inline int64_t AlignUp(int64_t x) { return (x + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment; }

inline absl::StatusOr<at::ScalarType> DtypeFromName(const std::string& name) {
  if (name == "f32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "f16") return at::kHalf;
  return absl::InvalidArgumentError(absl::StrCat("dtype: unsupported \"", name, "\" (f32, bf16, f16)"));
}

inline int64_t SlotBytes(const TensorSlot& slot, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t d : slot.shape()) n *= d;
  return n * static_cast<int64_t>(c10::elementSize(dtype));
}

// A tensor ready to be copied byte-wise: contiguous, on the CPU.
inline at::Tensor HostContiguous(const at::Tensor& t) { return t.detach().to(at::kCPU).contiguous(); }

// Copies every tensor into its slot; `bucket_ptr(i)` gives bucket i's memory.
template <typename BucketPtr>
inline void PackInto(const NamedTensors& tensors, const WeightLayout& layout, BucketPtr bucket_ptr) {
  for (int i = 0; i < layout.tensors_size(); ++i) {
    const TensorSlot& slot = layout.tensors(i);
    at::Tensor h = HostContiguous(tensors[i].second);
    std::memcpy(static_cast<char*>(bucket_ptr(slot.bucket())) + slot.byte_offset(), h.data_ptr(), h.nbytes());
  }
}

// Copies every slot out into a fresh CPU tensor. REQUIRES: ValidateLayout ok.
template <typename BucketPtr>
inline NamedTensors UnpackFrom(const WeightLayout& layout, BucketPtr bucket_ptr) {
  NamedTensors out;
  out.reserve(layout.tensors_size());
  for (const TensorSlot& slot : layout.tensors()) {
    at::ScalarType dtype = *DtypeFromName(slot.dtype());
    std::vector<int64_t> shape(slot.shape().begin(), slot.shape().end());
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
    std::memcpy(t.data_ptr(), static_cast<const char*>(bucket_ptr(slot.bucket())) + slot.byte_offset(), t.nbytes());
    out.emplace_back(slot.name(), std::move(t));
  }
  return out;
}

// Same version, same buckets, same slots.
inline absl::Status CheckExpected(const WeightLayout& expected, const WeightLayout& got) {
  if (got.version() != expected.version()) {
    return absl::FailedPreconditionError(
        absl::StrCat("weight sync: expected version ", expected.version(), ", received ", got.version()));
  }
  if (expected.tensors_size() == 0) return absl::OkStatus();
  if (expected.SerializeAsString() != got.SerializeAsString()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: the received layout of version ", got.version(),
                     " differs from the expected one (buckets ", got.bucket_bytes_size(), " vs ",
                     expected.bucket_bytes_size(), ", tensors ", got.tensors_size(), " vs ",
                     expected.tensors_size(), ")"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckVersionForward(int64_t version, int64_t last) {
  if (version <= 0) return absl::InvalidArgumentError(absl::StrCat("version: must be > 0, got ", version));
  if (version <= last) {
    return absl::InvalidArgumentError(
        absl::StrCat("version: ", version, " does not exceed the last published ", last));
  }
  return absl::OkStatus();
}

// `destinations` reordered as the layout's tensors; each must be a
// contiguous tensor on `device` of the slot's dtype and shape, and every
// slot needs one. INVALID_ARGUMENT names the tensor.
inline absl::StatusOr<NamedTensors> OrderDestinations(const WeightLayout& layout, const NamedTensors& destinations,
                                                      const c10::Device& device = c10::Device(c10::kCPU)) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : destinations) by_name[name] = &t;
  NamedTensors out;
  for (const TensorSlot& slot : layout.tensors()) {
    auto it = by_name.find(slot.name());
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("destinations: no tensor named ", slot.name()));
    }
    const at::Tensor& t = *it->second;
    auto dtype = DtypeName(t);
    std::vector<int64_t> shape(slot.shape().begin(), slot.shape().end());
    if (!dtype.ok() || *dtype != slot.dtype() || t.sizes().vec() != shape || !t.is_contiguous() ||
        t.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat("destinations[", slot.name(), "]: must be a contiguous ",
                                                     device.str(), " tensor of ", slot.dtype(),
                                                     " with the layout's shape"));
    }
    out.emplace_back(slot.name(), t);
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("destinations[", by_name.begin()->first, "]: not in the layout of version ", layout.version()));
  }
  return out;
}

// CUDA ordering, by events, never by the legacy default stream: a backend
// copies on a stream of its own, after the work LibTorch queued on its
// current stream (what wrote the sources, what still reads the
// destinations), and the host waits for the backend's own work alone.

// A cudaEvent_t without timing, destroyed with the object (CUDA frees it
// once the work it was recorded after is done).
class CudaEvent {
 public:
  explicit CudaEvent(const CudaRuntimeApi& cuda) : cuda_(cuda) {}
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() {
    if (event_ != nullptr) cuda_.EventDestroy(event_);
  }

  // Marks the work queued on `stream` so far.
  absl::Status Record(cudaStream_t stream, const std::string& what) {
    if (event_ == nullptr) {
      const cudaError_t e = cuda_.EventCreateWithFlags(&event_, cudaEventDisableTiming);
      if (e != cudaSuccess) {
        event_ = nullptr;
        return absl::AbortedError(absl::StrCat(what, ": ", cuda_.Error("cudaEventCreateWithFlags", e)));
      }
    }
    const cudaError_t e = cuda_.EventRecord(event_, stream);
    if (e != cudaSuccess) return absl::AbortedError(absl::StrCat(what, ": ", cuda_.Error("cudaEventRecord", e)));
    return absl::OkStatus();
  }

  // REQUIRES: Record() ok.
  cudaEvent_t get() const { return event_; }

 private:
  const CudaRuntimeApi& cuda_;
  cudaEvent_t event_ = nullptr;
};

// Makes `waiter` wait, on the device, for the work queued on `producer` so
// far; the host goes on.
inline absl::Status StreamAfter(const CudaRuntimeApi& cuda, cudaStream_t waiter, cudaStream_t producer,
                                const std::string& what) {
  CudaEvent done(cuda);
  RLMESH_RETURN_IF_ERROR(done.Record(producer, what));
  const cudaError_t e = cuda.StreamWaitEvent(waiter, done.get(), 0);
  if (e != cudaSuccess) return absl::AbortedError(absl::StrCat(what, ": ", cuda.Error("cudaStreamWaitEvent", e)));
  return absl::OkStatus();
}

// Makes `stream` wait, on the device, for the work the calling thread's
// LibTorch queued on GPU `device` so far (its current stream there).
absl::Status StreamAfterTorch(const CudaRuntimeApi& cuda, int device, cudaStream_t stream, const std::string& what);

// Waits, by the deadline, for the work queued on `stream` so far: an event
// recorded there, polled (CUDA has no timed wait). `poll`, called between
// queries, may fail the wait (NCCL's asynchronous error). DEADLINE_EXCEEDED
// names `what`.
template <typename Poll>
absl::Status WaitStream(const CudaRuntimeApi& cuda, cudaStream_t stream, absl::Time deadline, const std::string& what,
                        Poll poll) {
  CudaEvent done(cuda);
  RLMESH_RETURN_IF_ERROR(done.Record(stream, what));
  for (int spins = 0;; ++spins) {
    const cudaError_t q = cuda.EventQuery(done.get());
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return absl::AbortedError(absl::StrCat(what, ": ", cuda.Error("cudaEventQuery", q)));
    RLMESH_RETURN_IF_ERROR(poll());
    if (absl::Now() > deadline) return absl::DeadlineExceededError(absl::StrCat(what, ": not done by the deadline"));
    // Spin briefly (a bucket copy takes microseconds), then back off.
    if (spins > 100) absl::SleepFor(absl::Microseconds(spins > 1000 ? 200 : 20));
  }
}

// ---------------------------------------------------------------------------
// GLOO and NCCL: header {version, layout bytes} -> layout -> buckets, all
// broadcast from rank 0 through a BroadcastGroup. Buckets live on the
// group's device (the CPU for GLOO, the rank's GPU for NCCL) and go one at
// a time through two buffers: the publisher packs bucket i + 1 while bucket
// i is on the wire, a receiver unpacks bucket i while bucket i + 1 arrives.
// Neither side holds more than two buckets beyond the tensors themselves. A
// receiver drains every bucket even when the version is not the one it
// expected, so the group stays aligned for the next round.

// One collective channel from rank 0 to every other rank, one broadcast in
// flight at a time. A failed broadcast leaves the group unusable
// (FAILED_PRECONDITION afterwards).
class BroadcastGroup {
 public:
  virtual ~BroadcastGroup() = default;
  // Where the buckets must be: the CPU (GLOO) or the rank's GPU (NCCL).
  virtual c10::Device device() const = 0;
  // Starts broadcasting `bucket`, a contiguous byte tensor on device():
  // rank 0 sends it, every other rank receives into it. Work already queued
  // on the device that writes `bucket` (a copy into it) is ordered before
  // the send. REQUIRES: no broadcast in flight (Wait returned).
  virtual absl::Status Start(const at::Tensor& bucket) = 0;
  // Waits for the broadcast Start began, by spec.timeout_ms from its
  // start; then `bucket` holds the bytes and may be read or reused. OK when
  // nothing is in flight.
  virtual absl::Status Wait() = 0;
  // "gloo" / "nccl", for messages.
  virtual const char* name() const = 0;
};

// Rank 0 sends `bytes` bytes of host memory at `data`; every other rank
// receives them into `data` (through a device copy for NCCL).
absl::Status BroadcastHostBytes(BroadcastGroup& group, void* data, int64_t bytes);

// The TCPStore at spec.store_host:store_port under
// "weight_sync/<group_name><suffix>", the rendezvous of one group.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> GroupStore(const WeightSyncSpec& spec, const std::string& suffix);

// FAILED_PRECONDITION for a group used after it failed.
absl::Status BrokenGroup(const char* backend, const WeightSyncSpec& spec);

// FAILED_PRECONDITION "<backend> backend: <what is missing>" unless the CUDA
// runtime loads and sees a device.
absl::StatusOr<const CudaRuntimeApi*> RequireCuda(const char* backend);

// One constructor per backend (each defined in its own file).
std::unique_ptr<WeightPublisher> NewInProcessPublisher(const WeightSyncSpec& spec);
std::unique_ptr<WeightReceiver> NewInProcessReceiver(const WeightSyncSpec& spec);
std::unique_ptr<WeightPublisher> NewShmPublisher(const WeightSyncSpec& spec);
std::unique_ptr<WeightReceiver> NewShmReceiver(const WeightSyncSpec& spec);
std::unique_ptr<WeightPublisher> NewCudaIpcPublisher(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda,
                                                     int device);
std::unique_ptr<WeightReceiver> NewCudaIpcReceiver(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda);
// GLOO and NCCL: the publisher (rank 0) and receivers over `group`.
std::unique_ptr<WeightPublisher> NewCollectivePublisher(const WeightSyncSpec& spec, WeightSyncBackend backend,
                                                        std::unique_ptr<BroadcastGroup> group);
std::unique_ptr<WeightReceiver> NewCollectiveReceiver(const WeightSyncSpec& spec, WeightSyncBackend backend,
                                                      std::unique_ptr<BroadcastGroup> group);
// The group of a GLOO or NCCL spec; nothing connects until the first
// Broadcast. NCCL: FAILED_PRECONDITION naming a missing library or device.
absl::StatusOr<std::unique_ptr<BroadcastGroup>> MakeBroadcastGroup(const WeightSyncSpec& spec);
std::unique_ptr<BroadcastGroup> NewGlooGroup(const WeightSyncSpec& spec);
std::unique_ptr<BroadcastGroup> NewNcclGroup(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda,
                                             const NcclApi* nccl, int device);

}  // namespace rlmesh::weight_sync::internal
