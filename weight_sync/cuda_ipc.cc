#include "weight_sync/internal.h"

#include <algorithm>
#include <map>

#include "common/log.h"
#include "dist/device.h"
#include "weight_sync/shm_files.h"

namespace rlmesh::weight_sync::internal {
namespace {

// ---------------------------------------------------------------------------
// CUDA_IPC: the publisher keeps two slots of device buffers (one per bucket,
// version v in slot v % 2, allocated once and reused while the bucket sizes
// stay), copies each version in with cudaMemcpy and shares them through the
// SHM backend's host-side channel under spec.shm_prefix: an "ipc-seq" file
// with one seqlock word per slot and an "ipc-v<N>" manifest per version
// (written last, atomically) holding the publisher's pid and GPU (PCI bus
// id), each bucket's cudaIpcMemHandle_t and allocation number, and the
// layout. A receiver opens each handle once (re-opened only when the
// allocation number changes) on the GPU with that bus id and copies device
// -> device into tensors on that GPU; a reader overtaken by the publisher
// (the slot's word changed during the copy) gets ABORTED, as with SHM. In the
// publisher's own process (tests) a handle cannot be opened, so the raw
// device pointer is used.
//
// Nothing goes through host memory when the tensors are on the GPU: the
// publisher copies device tensors device -> device (host tensors host ->
// device), and the receiver's tensors are LibTorch tensors on the
// publisher's GPU. Both sides first wait, by the deadline, for LibTorch's
// work queued on the legacy default stream (what wrote the publisher's
// tensors; what still reads the receiver's destinations), since their own
// copies run on a non-blocking stream.

constexpr char kIpcMagic[8] = {'R', 'L', 'M', 'I', 'P', 'C', '1', '\0'};

struct IpcBucket {
  int64_t bytes = 0;
  int64_t allocation = 0;  // publisher-unique number of the device buffer
  uint64_t pointer = 0;    // the publisher's device address (same process only)
  cudaIpcMemHandle_t handle;
};

struct IpcManifest {
  int64_t pid = 0;
  std::string bus_id;
  std::vector<IpcBucket> buckets;
  WeightLayout layout;
};

std::string IpcSeqPath(const std::string& prefix) { return absl::StrCat(prefix, "ipc-seq"); }
std::string IpcManifestPath(const std::string& prefix, int64_t version) {
  return absl::StrCat(prefix, "ipc-v", version);
}

template <typename T>
void AppendRaw(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

std::string EncodeIpcManifest(const IpcManifest& m) {
  std::string out(kIpcMagic, sizeof(kIpcMagic));
  AppendRaw(&out, m.pid);
  char bus[32] = {0};
  std::memcpy(bus, m.bus_id.data(), std::min(m.bus_id.size(), sizeof(bus) - 1));
  out.append(bus, sizeof(bus));
  AppendRaw(&out, static_cast<int64_t>(m.buckets.size()));
  for (const IpcBucket& b : m.buckets) {
    AppendRaw(&out, b.bytes);
    AppendRaw(&out, b.allocation);
    AppendRaw(&out, b.pointer);
    AppendRaw(&out, b.handle);
  }
  out += m.layout.SerializeAsString();
  return out;
}

absl::StatusOr<IpcManifest> DecodeIpcManifest(const std::string& text, const std::string& path) {
  auto corrupt = [&](const char* what) {
    return absl::DataLossError(absl::StrCat("weight sync (cuda ipc): corrupt manifest ", path, " (", what, ")"));
  };
  size_t at = 0;
  auto take = [&](void* dst, size_t n) {
    if (text.size() - at < n) return false;
    std::memcpy(dst, text.data() + at, n);
    at += n;
    return true;
  };
  char magic[sizeof(kIpcMagic)];
  if (!take(magic, sizeof(magic)) || std::memcmp(magic, kIpcMagic, sizeof(magic)) != 0) return corrupt("magic");
  IpcManifest m;
  char bus[32];
  int64_t n = 0;
  if (!take(&m.pid, sizeof(m.pid)) || !take(bus, sizeof(bus)) || !take(&n, sizeof(n))) return corrupt("header");
  bus[sizeof(bus) - 1] = '\0';
  m.bus_id = bus;
  if (n < 0 || n > (int64_t{1} << 20)) return corrupt("bucket count");
  m.buckets.resize(static_cast<size_t>(n));
  for (IpcBucket& b : m.buckets) {
    if (!take(&b.bytes, sizeof(b.bytes)) || !take(&b.allocation, sizeof(b.allocation)) ||
        !take(&b.pointer, sizeof(b.pointer)) || !take(&b.handle, sizeof(b.handle))) {
      return corrupt("buckets");
    }
  }
  if (!m.layout.ParseFromArray(text.data() + at, static_cast<int>(text.size() - at))) return corrupt("layout");
  if (m.layout.bucket_bytes_size() != static_cast<int>(m.buckets.size())) return corrupt("bucket count vs layout");
  for (int i = 0; i < m.layout.bucket_bytes_size(); ++i) {
    if (m.layout.bucket_bytes(i) != m.buckets[i].bytes) {
      return absl::InvalidArgumentError(absl::StrCat("bucket_bytes: bucket ", i, " of ", path, " holds ",
                                                     m.buckets[i].bytes, " bytes, the layout says ",
                                                     m.layout.bucket_bytes(i)));
    }
  }
  return m;
}

class CudaIpcPublisher final : public WeightPublisher {
 public:
  CudaIpcPublisher(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda, int device)
      : spec_(spec), prefix_(ShmPrefix(spec)), cuda_(cuda), device_(device) {}
  ~CudaIpcPublisher() override {
    for (int64_t v : manifests_) unlink(IpcManifestPath(prefix_, v).c_str());
    if (seq_.data() != nullptr) unlink(IpcSeqPath(prefix_).c_str());
    if (stream_ == nullptr || cuda_->SetDevice(device_) != cudaSuccess) return;
    for (auto& slot : slots_) {
      for (Buffer& b : slot) {
        if (b.ptr != nullptr) cuda_->Free(b.ptr);
      }
    }
    cuda_->StreamDestroy(stream_);
  }

  absl::StatusOr<WeightLayout> Publish(const NamedTensors& tensors, int64_t version) override {
    if (broken_) return absl::FailedPreconditionError("weight sync (cuda ipc): a copy failed earlier; create a new publisher");
    RLMESH_RETURN_IF_ERROR(CheckVersionForward(version, last_));
    RLMESH_ASSIGN_OR_RETURN(WeightLayout layout, BuildLayout(tensors, version, BucketBytes(spec_)));
    RLMESH_RETURN_IF_ERROR(Init());
    const int slot = SlotOf(version);
    // New readers must not start on the version this slot held.
    for (auto it = manifests_.begin(); it != manifests_.end();) {
      if (SlotOf(*it) == slot) {
        unlink(IpcManifestPath(prefix_, *it).c_str());
        it = manifests_.erase(it);
      } else {
        ++it;
      }
    }
    StoreSeq(seq_, slot, -version);
    absl::Status s = Write(slot, tensors, layout);
    if (!s.ok()) return s;  // the slot stays marked as being written
    StoreSeq(seq_, slot, version);
    IpcManifest m;
    m.pid = getpid();
    m.bus_id = bus_id_;
    for (const Buffer& b : slots_[slot]) {
      IpcBucket ib;
      ib.bytes = b.bytes;
      ib.allocation = b.allocation;
      ib.pointer = reinterpret_cast<uint64_t>(b.ptr);
      ib.handle = b.handle;
      m.buckets.push_back(ib);
    }
    m.layout = layout;
    RLMESH_RETURN_IF_ERROR(WriteManifest(IpcManifestPath(prefix_, version), EncodeIpcManifest(m)));
    manifests_.push_back(version);
    last_ = version;
    return layout;
  }
  WeightSyncBackend backend() const override { return WEIGHT_SYNC_CUDA_IPC; }

 private:
  struct Buffer {
    void* ptr = nullptr;
    int64_t bytes = 0;
    int64_t allocation = 0;
    cudaIpcMemHandle_t handle;
  };

  absl::Status CudaCall(const char* call, cudaError_t e) const {
    if (e == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("weight sync (cuda ipc publisher, device ", device_, "): ", cuda_->Error(call, e)));
  }

  absl::Status Init() {
    if (seq_.data() == nullptr) RLMESH_RETURN_IF_ERROR(seq_.Create(IpcSeqPath(prefix_), 2 * sizeof(int64_t)));
    if (stream_ != nullptr) return CudaCall("cudaSetDevice", cuda_->SetDevice(device_));
    // The device the learner's policy lives on (spec.device).
    RLMESH_RETURN_IF_ERROR(CudaCall("cudaSetDevice", cuda_->SetDevice(device_)));
    char bus[32] = {0};
    RLMESH_RETURN_IF_ERROR(CudaCall("cudaDeviceGetPCIBusId", cuda_->DeviceGetPCIBusId(bus, sizeof(bus) - 1, device_)));
    bus_id_ = bus;
    return CudaCall("cudaStreamCreateWithFlags", cuda_->StreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  absl::Status Write(int slot, const NamedTensors& tensors, const WeightLayout& layout) {
    auto& buffers = slots_[slot];
    const int n = layout.bucket_bytes_size();
    for (int b = n; b < static_cast<int>(buffers.size()); ++b) cuda_->Free(buffers[b].ptr);
    buffers.resize(n);
    for (int b = 0; b < n; ++b) {
      Buffer& buf = buffers[b];
      if (buf.ptr != nullptr && buf.bytes == layout.bucket_bytes(b)) continue;
      if (buf.ptr != nullptr) cuda_->Free(buf.ptr);
      buf = Buffer();
      // At least one byte: an IPC handle needs an allocation.
      const size_t size = static_cast<size_t>(std::max<int64_t>(layout.bucket_bytes(b), 1));
      const cudaError_t e = cuda_->Malloc(&buf.ptr, size);
      if (e != cudaSuccess) {
        buf.ptr = nullptr;
        return absl::ResourceExhaustedError(absl::StrCat("weight sync (cuda ipc publisher): ", cuda_->Error("cudaMalloc", e),
                                                         " for ", size, " bytes"));
      }
      buf.bytes = layout.bucket_bytes(b);
      buf.allocation = ++allocations_;
      RLMESH_RETURN_IF_ERROR(CudaCall("cudaIpcGetMemHandle", cuda_->IpcGetMemHandle(&buf.handle, buf.ptr)));
    }
    // The sources: contiguous, on their device (a GPU tensor stays there)
    // or on the host; alive until the stream is done with them.
    std::vector<at::Tensor> sources;
    bool on_gpu = false;
    try {
      for (const auto& [name, t] : tensors) {
        on_gpu |= t.is_cuda();
        sources.push_back(t.is_cuda() ? t.detach().contiguous() : HostContiguous(t));
      }
    } catch (const std::exception& e) {
      return dist::ExceptionStatus(e, absl::StatusCode::kInternal, "weight sync (cuda ipc publisher): copying tensors");
    }
    const absl::Time deadline = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    if (on_gpu) {
      RLMESH_RETURN_IF_ERROR(SyncStream(*cuda_, cudaStreamLegacy, deadline,
                                        "weight sync (cuda ipc publisher): LibTorch's work on the tensors",
                                        [] { return absl::OkStatus(); }));
    }
    for (int i = 0; i < layout.tensors_size(); ++i) {
      const TensorSlot& s = layout.tensors(i);
      if (sources[i].nbytes() == 0) continue;
      // cudaMemcpyDefault: host -> device or device -> device, by address.
      RLMESH_RETURN_IF_ERROR(CudaCall("cudaMemcpyAsync",
                                      cuda_->MemcpyAsync(static_cast<char*>(buffers[s.bucket()].ptr) + s.byte_offset(),
                                                         sources[i].data_ptr(), sources[i].nbytes(), cudaMemcpyDefault,
                                                         stream_)));
    }
    absl::Status s = SyncStream(*cuda_, stream_, deadline, "weight sync (cuda ipc publisher): copy into the buckets",
                                [] { return absl::OkStatus(); });
    if (!s.ok()) broken_ = true;  // the stream may still be writing
    return s;
  }

  const WeightSyncSpec spec_;
  const std::string prefix_;
  const CudaRuntimeApi* const cuda_;
  const int device_;  // spec.device's index
  std::string bus_id_;
  cudaStream_t stream_ = nullptr;
  int64_t last_ = 0;
  int64_t allocations_ = 0;
  bool broken_ = false;
  Mapping seq_;
  std::vector<Buffer> slots_[2];
  std::vector<int64_t> manifests_;  // versions with a manifest
};

class CudaIpcReceiver final : public WeightReceiver {
 public:
  CudaIpcReceiver(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda)
      : spec_(spec), prefix_(ShmPrefix(spec)), cuda_(cuda) {}
  ~CudaIpcReceiver() override { Reset(); }

  absl::StatusOr<NamedTensors> Receive(const WeightLayout& expected, WeightLayout* received) override {
    RLMESH_ASSIGN_OR_RETURN(IpcManifest m, ReadManifest(expected));
    RLMESH_ASSIGN_OR_RETURN(c10::Device device, OpenVersion(m));
    NamedTensors out;
    try {
      for (const TensorSlot& slot : m.layout.tensors()) {
        std::vector<int64_t> shape(slot.shape().begin(), slot.shape().end());
        out.emplace_back(slot.name(),
                         at::empty(shape, at::TensorOptions().dtype(*DtypeFromName(slot.dtype())).device(device)));
      }
    } catch (const std::exception& e) {
      return dist::ExceptionStatus(e, absl::StatusCode::kInternal, "weight sync (cuda ipc receiver): allocating");
    }
    RLMESH_RETURN_IF_ERROR(CopyOut(m, out));
    if (received) *received = m.layout;
    return out;
  }

  absl::Status ReceiveInto(const WeightLayout& expected, const NamedTensors& destinations,
                           WeightLayout* received) override {
    RLMESH_ASSIGN_OR_RETURN(IpcManifest m, ReadManifest(expected));
    RLMESH_ASSIGN_OR_RETURN(c10::Device device, OpenVersion(m));
    RLMESH_ASSIGN_OR_RETURN(NamedTensors ordered, OrderDestinations(m.layout, destinations, device));
    RLMESH_RETURN_IF_ERROR(CopyOut(m, ordered));
    if (received) *received = m.layout;
    return absl::OkStatus();
  }
  WeightSyncBackend backend() const override { return WEIGHT_SYNC_CUDA_IPC; }

 private:
  struct Opened {
    int64_t pid = 0;
    int64_t allocation = 0;
    void* ptr = nullptr;
    bool imported = false;  // through cudaIpcOpenMemHandle (closed on reset)
  };

  absl::Status CudaCall(const char* call, cudaError_t e) const {
    if (e == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("weight sync (cuda ipc receiver): ", cuda_->Error(call, e)));
  }

  void CloseAll() {
    for (auto& slot : opened_) {
      for (Opened& o : slot) {
        if (o.imported && o.ptr != nullptr) cuda_->IpcCloseMemHandle(o.ptr);
      }
      slot.clear();
    }
  }

  void Reset() {
    if (device_ < 0 || cuda_->SetDevice(device_) != cudaSuccess) return;
    CloseAll();
    if (stream_ != nullptr) cuda_->StreamDestroy(stream_);
    stream_ = nullptr;
    device_ = -1;
    bus_id_.clear();
  }

  absl::StatusOr<IpcManifest> ReadManifest(const WeightLayout& expected) {
    if (expected.version() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("layout.version: must be > 0, got ", expected.version()));
    }
    const std::string path = IpcManifestPath(prefix_, expected.version());
    const absl::Time deadline = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    absl::StatusOr<std::string> text = ReadFile(path);
    while (!text.ok() && absl::IsNotFound(text.status()) && absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(500));
      text = ReadFile(path);
    }
    if (!text.ok()) {
      if (absl::IsNotFound(text.status())) {
        return absl::DeadlineExceededError(absl::StrCat("weight sync (cuda ipc): version ", expected.version(),
                                                        " not published within ", TimeoutMs(spec_), " ms (no ",
                                                        path, ")"));
      }
      return text.status();
    }
    RLMESH_ASSIGN_OR_RETURN(IpcManifest m, DecodeIpcManifest(*text, path));
    RLMESH_RETURN_IF_ERROR(CheckExpected(expected, m.layout));
    RLMESH_RETURN_IF_ERROR(ValidateLayout(m.layout));
    return m;
  }

  // The publisher's GPU, its stream and every bucket of the version's slot
  // opened here.
  absl::Status Open(const IpcManifest& m, int slot) {
    if (m.bus_id != bus_id_) {
      Reset();
      int device = -1;
      const cudaError_t e = cuda_->DeviceGetByPCIBusId(&device, m.bus_id.c_str());
      if (e != cudaSuccess) {
        return absl::FailedPreconditionError(absl::StrCat("weight sync (cuda ipc): the publisher's GPU ", m.bus_id,
                                                          " is not visible here (", cuda_->Error("cudaDeviceGetByPCIBusId", e),
                                                          ")"));
      }
      RLMESH_RETURN_IF_ERROR(CudaCall("cudaSetDevice", cuda_->SetDevice(device)));
      RLMESH_RETURN_IF_ERROR(
          CudaCall("cudaStreamCreateWithFlags", cuda_->StreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
      device_ = device;
      bus_id_ = m.bus_id;
    }
    RLMESH_RETURN_IF_ERROR(CudaCall("cudaSetDevice", cuda_->SetDevice(device_)));
    auto& opened = opened_[slot];
    for (size_t b = m.buckets.size(); b < opened.size(); ++b) {
      if (opened[b].imported) cuda_->IpcCloseMemHandle(opened[b].ptr);
    }
    opened.resize(m.buckets.size());
    const int64_t self = getpid();
    for (size_t b = 0; b < m.buckets.size(); ++b) {
      Opened& o = opened[b];
      const IpcBucket& ib = m.buckets[b];
      if (o.ptr != nullptr && o.pid == m.pid && o.allocation == ib.allocation) continue;
      if (o.imported) cuda_->IpcCloseMemHandle(o.ptr);
      o = Opened();
      if (m.pid == self) {
        o.ptr = reinterpret_cast<void*>(ib.pointer);
      } else {
        const cudaError_t e = cuda_->IpcOpenMemHandle(&o.ptr, ib.handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
          o = Opened();
          cuda_->GetLastError();
          // The publisher may have replaced the buffer since the manifest.
          if (LoadSeq(seq_, slot) != m.layout.version()) return Torn(m.layout.version());
          return absl::UnavailableError(absl::StrCat("weight sync (cuda ipc): opening bucket ", b, " of version ",
                                                     m.layout.version(), ": ", cuda_->Error("cudaIpcOpenMemHandle", e)));
        }
        o.imported = true;
      }
      o.pid = m.pid;
      o.allocation = ib.allocation;
    }
    return absl::OkStatus();
  }

  absl::Status Torn(int64_t version) const {
    return absl::AbortedError(absl::StrCat("weight sync (cuda ipc): version ", version,
                                           " was overwritten while being read (the publisher is two versions "
                                           "ahead); receive a newer version"));
  }

  // Opens the publisher's GPU and the version's slot (ABORTED when the slot
  // has moved on); returns that GPU as LibTorch's device, where the
  // received tensors live.
  absl::StatusOr<c10::Device> OpenVersion(const IpcManifest& m) {
    if (seq_.data() == nullptr) RLMESH_RETURN_IF_ERROR(seq_.Open(IpcSeqPath(prefix_), 2 * sizeof(int64_t)));
    const int slot = SlotOf(m.layout.version());
    if (LoadSeq(seq_, slot) != m.layout.version()) return Torn(m.layout.version());
    RLMESH_RETURN_IF_ERROR(Open(m, slot));
    return dist::ResolveDevice(absl::StrCat("cuda:", device_), "CUDA_IPC receiver");
  }

  // Copies every slot into `out` (layout order; tensors on the opened GPU),
  // then checks that the publisher did not overwrite the slot meanwhile.
  // REQUIRES: OpenVersion(m) ok.
  absl::Status CopyOut(const IpcManifest& m, const NamedTensors& out) {
    const WeightLayout& layout = m.layout;
    const int slot = SlotOf(layout.version());
    const auto& opened = opened_[slot];
    const absl::Time deadline = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    RLMESH_RETURN_IF_ERROR(SyncStream(*cuda_, cudaStreamLegacy, deadline,
                                      "weight sync (cuda ipc receiver): LibTorch's work on the destinations",
                                      [] { return absl::OkStatus(); }));
    for (int i = 0; i < layout.tensors_size(); ++i) {
      const TensorSlot& s = layout.tensors(i);
      const at::Tensor& dst = out[i].second;
      if (dst.nbytes() == 0) continue;
      RLMESH_RETURN_IF_ERROR(CudaCall(
          "cudaMemcpyAsync", cuda_->MemcpyAsync(dst.data_ptr(), static_cast<const char*>(opened[s.bucket()].ptr) + s.byte_offset(),
                                                dst.nbytes(), cudaMemcpyDeviceToDevice, stream_)));
    }
    RLMESH_RETURN_IF_ERROR(SyncStream(*cuda_, stream_, deadline, "weight sync (cuda ipc receiver): device -> device copy",
                                      [] { return absl::OkStatus(); }));
    if (LoadSeq(seq_, slot) != layout.version()) return Torn(layout.version());
    return absl::OkStatus();
  }

  const WeightSyncSpec spec_;
  const std::string prefix_;
  const CudaRuntimeApi* const cuda_;
  int device_ = -1;
  std::string bus_id_;
  cudaStream_t stream_ = nullptr;
  Mapping seq_;
  std::vector<Opened> opened_[2];
};

}  // namespace

absl::StatusOr<const CudaRuntimeApi*> RequireCuda(const char* backend) {
  auto cuda = LoadCudaRuntime();
  if (!cuda.ok()) return absl::FailedPreconditionError(absl::StrCat(backend, " backend: ", cuda.status().message()));
  auto n = CudaDeviceCount();
  if (!n.ok()) return absl::FailedPreconditionError(absl::StrCat(backend, " backend: ", n.status().message()));
  return *cuda;
}

std::unique_ptr<WeightPublisher> NewCudaIpcPublisher(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda,
                                                     int device) {
  return std::make_unique<CudaIpcPublisher>(spec, cuda, device);
}

std::unique_ptr<WeightReceiver> NewCudaIpcReceiver(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda) {
  return std::make_unique<CudaIpcReceiver>(spec, cuda);
}

}  // namespace rlmesh::weight_sync::internal
