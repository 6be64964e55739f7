#include "weight_sync/internal.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "common/log.h"
#include "dist/device.h"
#include "dist/torch_cuda.h"
#include "weight_sync/ipc_mappings.h"
#include "weight_sync/shm_files.h"

namespace rlmesh::weight_sync::internal {
namespace {

// ---------------------------------------------------------------------------
// CUDA_IPC: the publisher keeps two slots of device buffers (one per bucket,
// version v in slot v % 2, allocated once and reused while the bucket sizes
// stay), copies each version in on a stream of its own and shares them
// through the SHM backend's host-side channel under spec.shm_prefix: an
// "ipc-seq" file with one seqlock word per slot and an "ipc-v<N>" manifest
// per version (written last, atomically) holding the publisher's pid and GPU
// (PCI bus id), each bucket's segment handle and offset, and the layout. A
// receiver maps each segment once (IpcMappings) on the GPU with that bus id
// and copies device -> device into tensors on that GPU; a reader overtaken
// by the publisher (the slot's word changed during the copy) gets ABORTED,
// as with SHM. In the publisher's own process (tests) a handle cannot be
// opened, so the raw device pointer is used.
//
// The buckets are LibTorch tensors: they come from its caching allocator,
// so they count against the process's memory fraction
// (dist::SetCudaMemoryFraction) and show in its memory figures, and running
// out is RESOURCE_EXHAUSTED naming the bytes. CUDA IPC shares whole
// cudaMalloc'd segments, so a bucket travels as its segment's handle plus
// its offset in it (dist::CachingAllocatorSegment). The allocator's
// expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
// cannot be shared this way; the publisher then fails naming the setting.
//
// Nothing goes through host memory when the tensors are on the GPU: the
// publisher copies device tensors device -> device (host tensors host ->
// device), and the receiver's tensors are LibTorch tensors on the
// publisher's GPU. Each side's stream first waits, on the device, for
// LibTorch's current stream (what wrote the publisher's tensors; what still
// reads the receiver's destinations); the host then waits, by the deadline,
// for that stream's copies alone.

constexpr char kIpcMagic[8] = {'R', 'L', 'M', 'I', 'P', 'C', '2', '\0'};

struct IpcBucket {
  int64_t bytes = 0;
  int64_t offset = 0;    // where the bucket starts in the segment `handle` names
  uint64_t pointer = 0;  // the publisher's device address (same process only)
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
    AppendRaw(&out, b.offset);
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
    if (!take(&b.bytes, sizeof(b.bytes)) || !take(&b.offset, sizeof(b.offset)) ||
        !take(&b.pointer, sizeof(b.pointer)) || !take(&b.handle, sizeof(b.handle))) {
      return corrupt("buckets");
    }
    if (b.offset < 0) return corrupt("bucket offset");
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
    if (broken_) {
      // The stream may still be writing into the buckets: they must never
      // go back to the allocator for other tensors.
      for (auto& slot : slots_) {
        for (Buffer& b : slot) new at::Tensor(std::move(b.tensor));
      }
    }
    if (stream_ != nullptr && cuda_->SetDevice(device_) == cudaSuccess) cuda_->StreamDestroy(stream_);
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
      ib.offset = b.offset;
      ib.pointer = reinterpret_cast<uint64_t>(b.tensor.data_ptr());
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
    at::Tensor tensor;  // bytes on device_, from LibTorch's caching allocator
    int64_t bytes = 0;
    int64_t offset = 0;  // tensor's start in the segment `handle` names
    cudaIpcMemHandle_t handle;
  };

  std::string What() const { return absl::StrCat("weight sync (cuda ipc publisher, device ", device_, ")"); }

  absl::Status CudaCall(const char* call, cudaError_t e) const {
    if (e == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(What(), ": ", cuda_->Error(call, e)));
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

  // A bucket of `bytes` (at least one: an IPC handle needs an allocation)
  // from LibTorch's allocator, with its segment's handle.
  absl::Status Allocate(int64_t bytes, Buffer* buf) {
    try {
      buf->tensor = at::empty({std::max<int64_t>(bytes, 1)},
                              at::TensorOptions().dtype(at::kByte).device(c10::Device(c10::kCUDA, device_)));
    } catch (const std::exception& e) {
      return dist::ExceptionStatus(e, absl::StatusCode::kInternal,
                                   absl::StrCat(What(), ": a bucket of ", bytes, " bytes"));
    }
    buf->bytes = bytes;
    RLMESH_ASSIGN_OR_RETURN(dist::AllocatorSegment segment, dist::CachingAllocatorSegment(buf->tensor.data_ptr()));
    buf->offset = static_cast<char*>(buf->tensor.data_ptr()) - static_cast<char*>(segment.base);
    const cudaError_t e = cuda_->IpcGetMemHandle(&buf->handle, segment.base);
    if (e == cudaSuccess) return absl::OkStatus();
    cuda_->GetLastError();
    const char* conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
    const bool expandable = conf != nullptr && absl::StrContains(conf, "expandable_segments:True");
    return absl::FailedPreconditionError(
        absl::StrCat(What(), ": ", cuda_->Error("cudaIpcGetMemHandle", e),
                     expandable ? "; PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True, whose memory CUDA IPC "
                                  "cannot share: unset it in the learner, or use weight_sync: nccl"
                                : ""));
  }

  absl::Status Write(int slot, const NamedTensors& tensors, const WeightLayout& layout) {
    auto& buffers = slots_[slot];
    // Buckets dropped or resized go back to the allocator: the stream is
    // done with them (every Write waits for it, or the publisher is broken).
    buffers.resize(layout.bucket_bytes_size());
    for (int b = 0; b < layout.bucket_bytes_size(); ++b) {
      if (buffers[b].tensor.defined() && buffers[b].bytes == layout.bucket_bytes(b)) continue;
      buffers[b] = Buffer();
      RLMESH_RETURN_IF_ERROR(Allocate(layout.bucket_bytes(b), &buffers[b]));
    }
    // The sources: contiguous, on their device (a GPU tensor stays there)
    // or on the host; alive until the stream is done with them.
    std::vector<at::Tensor> sources;
    try {
      for (const auto& [name, t] : tensors) sources.push_back(t.is_cuda() ? t.detach().contiguous() : HostContiguous(t));
    } catch (const std::exception& e) {
      return dist::ExceptionStatus(e, absl::StatusCode::kInternal, absl::StrCat(What(), ": copying tensors"));
    }
    const absl::Time deadline = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    // After LibTorch's work so far: what wrote the sources, and what last
    // used the buckets' memory before the allocator handed it here.
    RLMESH_RETURN_IF_ERROR(StreamAfterTorch(*cuda_, device_, stream_, absl::StrCat(What(), ": LibTorch's work")));
    for (int i = 0; i < layout.tensors_size(); ++i) {
      const TensorSlot& s = layout.tensors(i);
      if (sources[i].nbytes() == 0) continue;
      // cudaMemcpyDefault: host -> device or device -> device, by address.
      RLMESH_RETURN_IF_ERROR(CudaCall(
          "cudaMemcpyAsync", cuda_->MemcpyAsync(static_cast<char*>(buffers[s.bucket()].tensor.data_ptr()) + s.byte_offset(),
                                                sources[i].data_ptr(), sources[i].nbytes(), cudaMemcpyDefault, stream_)));
    }
    absl::Status s = WaitStream(*cuda_, stream_, deadline, absl::StrCat(What(), ": copy into the buckets"),
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
  bool broken_ = false;
  Mapping seq_;
  std::vector<Buffer> slots_[2];
  std::vector<int64_t> manifests_;  // versions with a manifest
};

class CudaIpcReceiver final : public WeightReceiver {
 public:
  CudaIpcReceiver(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda)
      : spec_(spec),
        prefix_(ShmPrefix(spec)),
        cuda_(cuda),
        mappings_(
            [cuda](const cudaIpcMemHandle_t& handle) -> absl::StatusOr<void*> {
              void* base = nullptr;
              const cudaError_t e = cuda->IpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
              if (e == cudaSuccess) return base;
              cuda->GetLastError();
              return absl::UnavailableError(cuda->Error("cudaIpcOpenMemHandle", e));
            },
            [cuda](void* base) { cuda->IpcCloseMemHandle(base); }) {}
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
  absl::Status CudaCall(const char* call, cudaError_t e) const {
    if (e == cudaSuccess) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("weight sync (cuda ipc receiver): ", cuda_->Error(call, e)));
  }

  void Reset() {
    if (device_ < 0 || cuda_->SetDevice(device_) != cudaSuccess) return;
    mappings_.CloseAll();
    for (auto& slot : buckets_) slot.clear();
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
    // Each bucket's address here: its segment mapped (once), plus its offset.
    auto& buckets = buckets_[slot];
    buckets.clear();
    const int64_t self = getpid();
    for (size_t b = 0; b < m.buckets.size(); ++b) {
      const IpcBucket& ib = m.buckets[b];
      if (m.pid == self) {
        buckets.push_back({{}, reinterpret_cast<char*>(ib.pointer)});
        continue;
      }
      absl::StatusOr<void*> base = mappings_.Open(m.pid, ib.handle);
      if (!base.ok()) {
        buckets.clear();
        // The publisher may have replaced the buffer since the manifest.
        if (LoadSeq(seq_, slot) != m.layout.version()) return Torn(m.layout.version());
        return absl::UnavailableError(absl::StrCat("weight sync (cuda ipc): opening bucket ", b, " of version ",
                                                   m.layout.version(), ": ", base.status().message()));
      }
      buckets.push_back({IpcMappings::KeyOf(m.pid, ib.handle), static_cast<char*>(*base) + ib.offset});
    }
    // Segments neither slot uses any more are unmapped.
    std::set<IpcMappings::Key> keep;
    for (const auto& held : buckets_) {
      for (const MappedBucket& mb : held) {
        if (!mb.key.second.empty()) keep.insert(mb.key);
      }
    }
    mappings_.Retain(keep);
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
    const auto& buckets = buckets_[slot];
    const absl::Time deadline = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    RLMESH_RETURN_IF_ERROR(StreamAfterTorch(*cuda_, device_, stream_,
                                            "weight sync (cuda ipc receiver): LibTorch's work on the destinations"));
    for (int i = 0; i < layout.tensors_size(); ++i) {
      const TensorSlot& s = layout.tensors(i);
      const at::Tensor& dst = out[i].second;
      if (dst.nbytes() == 0) continue;
      RLMESH_RETURN_IF_ERROR(CudaCall(
          "cudaMemcpyAsync", cuda_->MemcpyAsync(dst.data_ptr(), buckets[s.bucket()].ptr + s.byte_offset(),
                                                dst.nbytes(), cudaMemcpyDeviceToDevice, stream_)));
    }
    RLMESH_RETURN_IF_ERROR(WaitStream(*cuda_, stream_, deadline, "weight sync (cuda ipc receiver): device -> device copy",
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
  IpcMappings mappings_;
  // Per slot, each bucket of the version last opened there.
  struct MappedBucket {
    IpcMappings::Key key;  // its segment's; empty in the publisher's own process
    const char* ptr;
  };
  std::vector<MappedBucket> buckets_[2];
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
