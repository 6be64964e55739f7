#include "rollout/weight_sync.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "learner/data_parallel.h"
#include "rollout/cuda_api.h"

namespace rlmesh::rollout {
namespace {

int64_t TimeoutMs(const WeightSyncSpec& spec) {
  return spec.timeout_ms() > 0 ? spec.timeout_ms() : kDefaultWeightSyncTimeoutMs;
}

int64_t BucketBytes(const WeightSyncSpec& spec) {
  return static_cast<int64_t>(spec.bucket_mb() > 0 ? spec.bucket_mb() : kDefaultBucketMb) << 20;
}

int64_t AlignUp(int64_t x) { return (x + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment; }

absl::StatusOr<at::ScalarType> DtypeFromName(const std::string& name) {
  if (name == "f32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "f16") return at::kHalf;
  return absl::InvalidArgumentError(absl::StrCat("dtype: unsupported \"", name, "\" (f32, bf16, f16)"));
}

int64_t SlotBytes(const TensorSlot& slot, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t d : slot.shape()) n *= d;
  return n * static_cast<int64_t>(c10::elementSize(dtype));
}

// A tensor ready to be copied byte-wise: contiguous, on the CPU.
at::Tensor HostContiguous(const at::Tensor& t) { return t.detach().to(at::kCPU).contiguous(); }

// Copies every tensor into its slot; `bucket_ptr(i)` gives bucket i's memory.
template <typename BucketPtr>
void PackInto(const NamedTensors& tensors, const WeightLayout& layout, BucketPtr bucket_ptr) {
  for (int i = 0; i < layout.tensors_size(); ++i) {
    const TensorSlot& slot = layout.tensors(i);
    at::Tensor h = HostContiguous(tensors[i].second);
    std::memcpy(static_cast<char*>(bucket_ptr(slot.bucket())) + slot.byte_offset(), h.data_ptr(), h.nbytes());
  }
}

// Copies every slot out into a fresh CPU tensor. REQUIRES: ValidateLayout ok.
template <typename BucketPtr>
NamedTensors UnpackFrom(const WeightLayout& layout, BucketPtr bucket_ptr) {
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
absl::Status CheckExpected(const WeightLayout& expected, const WeightLayout& got) {
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

absl::Status CheckVersionForward(int64_t version, int64_t last) {
  if (version <= 0) return absl::InvalidArgumentError(absl::StrCat("version: must be > 0, got ", version));
  if (version <= last) {
    return absl::InvalidArgumentError(
        absl::StrCat("version: ", version, " does not exceed the last published ", last));
  }
  return absl::OkStatus();
}

// `destinations` reordered as the layout's tensors; each must be a
// contiguous CPU tensor of the slot's dtype and shape, and every slot needs
// one. INVALID_ARGUMENT names the tensor.
absl::StatusOr<NamedTensors> OrderDestinations(const WeightLayout& layout, const NamedTensors& destinations) {
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
        !t.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat("destinations[", slot.name(),
                                                     "]: must be a contiguous CPU tensor of ", slot.dtype(),
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

// ---------------------------------------------------------------------------
// IN_PROCESS

struct InProcessSlot {
  absl::Mutex mu;
  absl::CondVar cv;
  WeightLayout layout ABSL_GUARDED_BY(mu);
  std::vector<std::vector<char>> buckets ABSL_GUARDED_BY(mu);
};

InProcessSlot& InProcessGroup(const std::string& name) {
  static absl::Mutex* mu = new absl::Mutex;
  static auto* groups = new std::map<std::string, std::unique_ptr<InProcessSlot>>;
  absl::MutexLock lock(mu);
  auto& g = (*groups)[name];
  if (!g) g = std::make_unique<InProcessSlot>();
  return *g;
}

class InProcessPublisher final : public WeightPublisher {
 public:
  explicit InProcessPublisher(const WeightSyncSpec& spec) : spec_(spec) {}
  absl::StatusOr<WeightLayout> Publish(const NamedTensors& tensors, int64_t version) override {
    RLMESH_RETURN_IF_ERROR(CheckVersionForward(version, last_));
    RLMESH_ASSIGN_OR_RETURN(WeightLayout layout, BuildLayout(tensors, version, BucketBytes(spec_)));
    std::vector<std::vector<char>> buckets;
    for (int64_t b : layout.bucket_bytes()) buckets.emplace_back(b);
    PackInto(tensors, layout, [&](int i) { return buckets[i].data(); });
    InProcessSlot& g = InProcessGroup(spec_.group_name());
    {
      absl::MutexLock lock(&g.mu);
      g.layout = layout;
      g.buckets = std::move(buckets);
    }
    g.cv.SignalAll();
    last_ = version;
    return layout;
  }
  WeightSyncBackend backend() const override { return WEIGHT_SYNC_IN_PROCESS; }

 private:
  const WeightSyncSpec spec_;
  int64_t last_ = 0;
};

class InProcessReceiver final : public WeightReceiver {
 public:
  explicit InProcessReceiver(const WeightSyncSpec& spec) : spec_(spec) {}
  absl::StatusOr<NamedTensors> Receive(const WeightLayout& expected, WeightLayout* received) override {
    InProcessSlot& g = InProcessGroup(spec_.group_name());
    absl::Time deadline = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    absl::MutexLock lock(&g.mu);
    while (g.layout.version() < expected.version()) {
      if (g.cv.WaitWithDeadline(&g.mu, deadline)) break;
    }
    if (g.layout.version() < expected.version()) {
      return absl::DeadlineExceededError(absl::StrCat("weight sync (in-process ", spec_.group_name(),
                                                      "): version ", expected.version(), " not published within ",
                                                      TimeoutMs(spec_), " ms"));
    }
    RLMESH_RETURN_IF_ERROR(CheckExpected(expected, g.layout));
    RLMESH_RETURN_IF_ERROR(ValidateLayout(g.layout));
    if (received) *received = g.layout;
    return UnpackFrom(g.layout, [&](int i) { return g.buckets[i].data(); });
  }
  WeightSyncBackend backend() const override { return WEIGHT_SYNC_IN_PROCESS; }

 private:
  const WeightSyncSpec spec_;
};

// ---------------------------------------------------------------------------
// SHM: two slots of bucket files on tmpfs, reused across versions (version v
// goes to slot v % 2), so publishing copies into pages that already exist
// instead of allocating fresh tmpfs pages (which ran at a third of memcpy
// speed). A "seq" file holds one word per slot: -v while version v is being
// written, v once complete (a seqlock), and one progress word per slot:
// (v << 24) | tensors of v written so far. The manifest v<N>.layout is
// written *before* the data (the slot is derived from the version); the
// manifest of the version a slot is about to lose is removed first. A reader
// copies each tensor as soon as the progress word covers it, so the
// publisher's copy in and the reader's copy out overlap (a hand-off costs
// about one copy, not two), and re-checks the slot's word at the end: if the
// publisher overwrote it meanwhile (it ran two versions ahead), the read is
// refused with ABORTED rather than returning torn data.

std::string ShmPrefix(const WeightSyncSpec& spec) {
  if (spec.shm_prefix().empty()) {
    return absl::StrCat("/dev/shm/rlmesh-", spec.group_name().empty() ? "weights" : spec.group_name(), "-");
  }
  if (!absl::StrContains(spec.shm_prefix(), "/")) return absl::StrCat("/dev/shm/", spec.shm_prefix());
  return spec.shm_prefix();
}

int SlotOf(int64_t version) { return static_cast<int>(version % 2); }
std::string BucketPath(const std::string& prefix, int slot, int bucket) {
  return absl::StrCat(prefix, "slot", slot, ".bucket", bucket);
}
std::string ManifestPath(const std::string& prefix, int64_t version) {
  return absl::StrCat(prefix, "v", version, ".layout");
}
std::string SeqPath(const std::string& prefix) { return absl::StrCat(prefix, "seq"); }

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == ENOSPC || e == ENOMEM) return absl::ResourceExhaustedError(msg);
  return absl::UnavailableError(msg);
}

// A shared mapping of a file, unmapped and closed on destruction.
class Mapping {
 public:
  ~Mapping() { Reset(); }
  void Reset() {
    if (addr_ != nullptr && addr_ != MAP_FAILED) munmap(addr_, size_);
    if (fd_ >= 0) close(fd_);
    addr_ = nullptr;
    fd_ = -1;
    size_ = 0;
  }
  // Opens or creates `path`, sizes it to `size` bytes (keeping the pages it
  // has) and maps it read-write.
  absl::Status Create(const std::string& path, int64_t size) {
    Reset();
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) return ErrnoError("open", path);
    if (ftruncate(fd_, size) != 0) return ErrnoError("ftruncate", path);
    return Map(path, size, PROT_READ | PROT_WRITE);
  }
  // Maps an existing file read-only; its size must be `size`.
  absl::Status Open(const std::string& path, int64_t size) {
    Reset();
    fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return ErrnoError("open", path);
    struct stat st;
    if (fstat(fd_, &st) != 0) return ErrnoError("stat", path);
    if (st.st_size != size) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket_bytes: ", path, " holds ", st.st_size, " bytes, the layout says ", size));
    }
    return Map(path, size, PROT_READ);
  }
  void* data() const { return addr_; }
  int64_t size() const { return static_cast<int64_t>(size_); }
  // Whether `path` is still the file this maps (same inode, same size).
  bool Same(const std::string& path) const {
    struct stat a, b;
    return fd_ >= 0 && fstat(fd_, &a) == 0 && stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino &&
           a.st_dev == b.st_dev && a.st_size == b.st_size && b.st_size == static_cast<off_t>(size_);
  }

 private:
  absl::Status Map(const std::string& path, int64_t size, int prot) {
    size_ = static_cast<size_t>(size);
    if (size == 0) return absl::OkStatus();
    // MAP_POPULATE: one call maps every page instead of a fault per 4 KiB
    // page during the copy.
    addr_ = mmap(nullptr, size_, prot, MAP_SHARED | MAP_POPULATE, fd_, 0);
    if (addr_ == MAP_FAILED) {
      addr_ = nullptr;
      return ErrnoError("mmap", path);
    }
    return absl::OkStatus();
  }
  int fd_ = -1;
  void* addr_ = nullptr;
  size_t size_ = 0;
};

int64_t LoadSeq(const Mapping& seq, int slot) {
  return __atomic_load_n(static_cast<int64_t*>(seq.data()) + slot, __ATOMIC_ACQUIRE);
}
void StoreSeq(const Mapping& seq, int slot, int64_t value) {
  __atomic_store_n(static_cast<int64_t*>(seq.data()) + slot, value, __ATOMIC_RELEASE);
}

// SHM progress words follow the two seq words: (version << 24) | tensors
// written. Layouts hold fewer than 2^24 tensors (checked on publish).
constexpr int kShmSeqWords = 4;
constexpr int kProgressShift = 24;
int64_t LoadProgress(const Mapping& seq, int slot) { return LoadSeq(seq, 2 + slot); }
void StoreProgress(const Mapping& seq, int slot, int64_t version, int64_t tensors) {
  StoreSeq(seq, 2 + slot, (version << kProgressShift) | tensors);
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("open", tmp);
  const bool ok = write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  close(fd);
  if (!ok) return ErrnoError("write", tmp);
  if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename", path);
  return absl::OkStatus();
}

class ShmPublisher final : public WeightPublisher {
 public:
  explicit ShmPublisher(const WeightSyncSpec& spec) : spec_(spec), prefix_(ShmPrefix(spec)) {}
  ~ShmPublisher() override {
    for (int64_t v : manifests_) unlink(ManifestPath(prefix_, v).c_str());
    for (int s = 0; s < 2; ++s) {
      for (size_t b = 0; b < slots_[s].size(); ++b) unlink(BucketPath(prefix_, s, static_cast<int>(b)).c_str());
    }
    if (seq_.data() != nullptr) unlink(SeqPath(prefix_).c_str());
  }

  absl::StatusOr<WeightLayout> Publish(const NamedTensors& tensors, int64_t version) override {
    RLMESH_RETURN_IF_ERROR(CheckVersionForward(version, last_));
    RLMESH_ASSIGN_OR_RETURN(WeightLayout layout, BuildLayout(tensors, version, BucketBytes(spec_)));
    if (seq_.data() == nullptr) {
      RLMESH_RETURN_IF_ERROR(seq_.Create(SeqPath(prefix_), kShmSeqWords * sizeof(int64_t)));
    }
    if (layout.tensors_size() >= (1 << kProgressShift)) {
      return absl::InvalidArgumentError(absl::StrCat("tensors: ", layout.tensors_size(), " exceed the shm limit"));
    }
    const int slot = SlotOf(version);
    // New readers must not start on the version this slot held.
    for (auto it = manifests_.begin(); it != manifests_.end();) {
      if (SlotOf(*it) == slot) {
        unlink(ManifestPath(prefix_, *it).c_str());
        it = manifests_.erase(it);
      } else {
        ++it;
      }
    }
    StoreSeq(seq_, slot, -version);
    StoreProgress(seq_, slot, version, 0);
    absl::Status s = MapSlot(slot, layout);
    if (!s.ok()) return s;  // the slot stays marked as being written
    // The manifest goes first: readers follow the progress word.
    RLMESH_RETURN_IF_ERROR(WriteFileAtomic(ManifestPath(prefix_, version), layout.SerializeAsString()));
    manifests_.push_back(version);
    s = Write(slot, tensors, layout);
    if (!s.ok()) return s;  // readers of this version time out
    StoreSeq(seq_, slot, version);
    last_ = version;
    return layout;
  }
  WeightSyncBackend backend() const override { return WEIGHT_SYNC_SHM; }

 private:
  // Sizes the slot's bucket files for `layout` (kept from version to
  // version when the sizes match).
  absl::Status MapSlot(int slot, const WeightLayout& layout) {
    auto& maps = slots_[slot];
    const int n = layout.bucket_bytes_size();
    for (int b = n; b < static_cast<int>(maps.size()); ++b) unlink(BucketPath(prefix_, slot, b).c_str());
    maps.resize(n);
    for (int b = 0; b < n; ++b) {
      if (!maps[b]) maps[b] = std::make_unique<Mapping>();
      if (maps[b]->data() == nullptr || maps[b]->size() != layout.bucket_bytes(b)) {
        RLMESH_RETURN_IF_ERROR(maps[b]->Create(BucketPath(prefix_, slot, b), layout.bucket_bytes(b)));
      }
    }
    return absl::OkStatus();
  }

  // Copies the tensors in layout order, publishing progress after each.
  absl::Status Write(int slot, const NamedTensors& tensors, const WeightLayout& layout) {
    auto& maps = slots_[slot];
    try {
      for (int i = 0; i < layout.tensors_size(); ++i) {
        const TensorSlot& ts = layout.tensors(i);
        at::Tensor h = HostContiguous(tensors[i].second);
        std::memcpy(static_cast<char*>(maps[ts.bucket()]->data()) + ts.byte_offset(), h.data_ptr(), h.nbytes());
        StoreProgress(seq_, slot, layout.version(), i + 1);
      }
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("weight sync (shm): copying tensors: ", e.what()));
    }
    return absl::OkStatus();
  }

  const WeightSyncSpec spec_;
  const std::string prefix_;
  int64_t last_ = 0;
  Mapping seq_;
  std::vector<std::unique_ptr<Mapping>> slots_[2];  // kept mapped: warm pages
  std::vector<int64_t> manifests_;                  // versions with a manifest
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path);
  std::string out;
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  if (n < 0) return ErrnoError("read", path);
  return out;
}

class ShmReceiver final : public WeightReceiver {
 public:
  explicit ShmReceiver(const WeightSyncSpec& spec) : spec_(spec), prefix_(ShmPrefix(spec)) {}

  absl::StatusOr<NamedTensors> Receive(const WeightLayout& expected, WeightLayout* received) override {
    WeightLayout layout;
    RLMESH_RETURN_IF_ERROR(ReadLayout(expected, &layout));
    NamedTensors out;
    try {
      for (const TensorSlot& slot : layout.tensors()) {
        std::vector<int64_t> shape(slot.shape().begin(), slot.shape().end());
        out.emplace_back(slot.name(), at::empty(shape, at::TensorOptions().dtype(*DtypeFromName(slot.dtype()))));
      }
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(absl::StrCat("weight sync (shm): allocating: ", e.what()));
    }
    RLMESH_RETURN_IF_ERROR(CopyOut(layout, out));
    if (received) *received = layout;
    return out;
  }

  absl::Status ReceiveInto(const WeightLayout& expected, const NamedTensors& destinations,
                           WeightLayout* received) override {
    WeightLayout layout;
    RLMESH_RETURN_IF_ERROR(ReadLayout(expected, &layout));
    RLMESH_ASSIGN_OR_RETURN(NamedTensors ordered, OrderDestinations(layout, destinations));
    RLMESH_RETURN_IF_ERROR(CopyOut(layout, ordered));
    if (received) *received = layout;
    return absl::OkStatus();
  }
  WeightSyncBackend backend() const override { return WEIGHT_SYNC_SHM; }

 private:
  absl::Status ReadLayout(const WeightLayout& expected, WeightLayout* layout) {
    if (expected.version() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("layout.version: must be > 0, got ", expected.version()));
    }
    const std::string manifest = ManifestPath(prefix_, expected.version());
    const absl::Time deadline = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    absl::StatusOr<std::string> text = ReadFile(manifest);
    while (!text.ok() && absl::IsNotFound(text.status()) && absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(500));
      text = ReadFile(manifest);
    }
    if (!text.ok()) {
      if (absl::IsNotFound(text.status())) {
        return absl::DeadlineExceededError(absl::StrCat("weight sync (shm): version ", expected.version(),
                                                        " not published within ", TimeoutMs(spec_),
                                                        " ms (no ", manifest, ")"));
      }
      return text.status();
    }
    if (!layout->ParseFromString(*text)) {
      return absl::DataLossError(absl::StrCat("weight sync (shm): corrupt layout manifest ", manifest));
    }
    RLMESH_RETURN_IF_ERROR(CheckExpected(expected, *layout));
    return ValidateLayout(*layout);
  }

  // Copies every slot into `out` (same order as the layout), then checks
  // that the publisher did not overwrite the slot meanwhile.
  absl::Status CopyOut(const WeightLayout& layout, const NamedTensors& out) {
    if (seq_.data() == nullptr) RLMESH_RETURN_IF_ERROR(seq_.Open(SeqPath(prefix_), kShmSeqWords * sizeof(int64_t)));
    const int64_t v = layout.version();
    const int slot = SlotOf(v);
    auto torn = [&] {
      return absl::AbortedError(absl::StrCat("weight sync (shm): version ", v,
                                             " was overwritten while being read (the publisher is two versions "
                                             "ahead); receive a newer version"));
    };
    // The slot holds v, complete or being written; anything else is newer.
    auto holds_v = [&] {
      const int64_t s = LoadSeq(seq_, slot);
      return s == v || s == -v;
    };
    if (!holds_v()) return torn();
    // The publisher reuses its files, so mappings are kept from one version
    // to the next and re-opened only when the file changed.
    auto& maps = maps_[slot];
    maps.resize(layout.bucket_bytes_size());
    for (int b = 0; b < layout.bucket_bytes_size(); ++b) {
      const std::string path = BucketPath(prefix_, slot, b);
      if (maps[b] && maps[b]->size() == layout.bucket_bytes(b) && maps[b]->Same(path)) continue;
      maps[b] = std::make_unique<Mapping>();
      absl::Status st = maps[b]->Open(path, layout.bucket_bytes(b));
      if (!st.ok()) {
        maps[b].reset();
        return st;
      }
    }
    const absl::Time deadline = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    int64_t written = 0;  // tensors of v the progress word covers
    for (int i = 0; i < layout.tensors_size(); ++i) {
      // Wait (spinning briefly, then sleeping) until the publisher wrote i.
      for (int spins = 0; written <= i; ++spins) {
        const int64_t p = LoadProgress(seq_, slot);
        if ((p >> kProgressShift) == v) {
          written = p & ((int64_t{1} << kProgressShift) - 1);
          if (written > i) break;
        } else if (!holds_v()) {
          return torn();
        }
        if (absl::Now() >= deadline) {
          return absl::DeadlineExceededError(absl::StrCat("weight sync (shm): version ", v, " stalled at tensor ", i,
                                                          " of ", layout.tensors_size(), " for ", TimeoutMs(spec_),
                                                          " ms"));
        }
        if (spins > 64) absl::SleepFor(absl::Microseconds(50));
      }
      const TensorSlot& s = layout.tensors(i);
      const at::Tensor& dst = out[i].second;
      std::memcpy(dst.data_ptr(), static_cast<const char*>(maps[s.bucket()]->data()) + s.byte_offset(), dst.nbytes());
    }
    if (!holds_v()) return torn();
    return absl::OkStatus();
  }

  const WeightSyncSpec spec_;
  const std::string prefix_;
  Mapping seq_;
  std::vector<std::unique_ptr<Mapping>> maps_[2];
};

// ---------------------------------------------------------------------------
// GLOO and NCCL: header {version, layout bytes} -> layout -> buckets, all
// broadcast from rank 0 through a BroadcastGroup. A receiver drains every
// bucket even when the version is not the one it expected, so the group
// stays aligned for the next round.

// One collective channel from rank 0 to every other rank. A failed
// broadcast leaves the group unusable (FAILED_PRECONDITION afterwards).
class BroadcastGroup {
 public:
  virtual ~BroadcastGroup() = default;
  // Rank 0 sends `bytes` bytes of host memory at `data`; every other rank
  // receives them into `data`. Bounded by spec.timeout_ms.
  virtual absl::Status Broadcast(void* data, int64_t bytes) = 0;
  // "gloo" / "nccl", for messages.
  virtual const char* name() const = 0;
};

// The TCPStore at spec.store_host:store_port under
// "weight_sync/<group_name><suffix>", the rendezvous of one group.
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> GroupStore(const WeightSyncSpec& spec, const std::string& suffix) {
  RLMESH_ASSIGN_OR_RETURN(auto store, learner::MakeTcpStore(spec.store_host(), spec.store_port(), /*is_server=*/false,
                                                            spec.world_size(), TimeoutMs(spec)));
  try {
    return c10::intrusive_ptr<c10d::Store>(
        c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("weight_sync/", spec.group_name(), suffix), store));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("weight sync store: ", e.what()));
  }
}

absl::Status BrokenGroup(const char* backend, const WeightSyncSpec& spec) {
  return absl::FailedPreconditionError(absl::StrCat("weight sync (", backend, " ", spec.group_name(),
                                                    "): the group failed earlier; configure a new group"));
}

class GlooGroup final : public BroadcastGroup {
 public:
  explicit GlooGroup(const WeightSyncSpec& spec) : spec_(spec) {}

  absl::Status Broadcast(void* data, int64_t bytes) override {
    RLMESH_RETURN_IF_ERROR(Connect());
    try {
      std::vector<at::Tensor> v{at::from_blob(data, {bytes}, at::TensorOptions().dtype(at::kByte))};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      opts.timeout = std::chrono::milliseconds(TimeoutMs(spec_));
      group_->broadcast(v, opts)->wait();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      broken_ = true;
      return absl::AbortedError(absl::StrCat("weight sync (gloo ", spec_.group_name(), " rank ", spec_.rank(),
                                             "): broadcast failed: ", e.what()));
    }
  }
  const char* name() const override { return "gloo"; }

 private:
  absl::Status Connect() {
    if (broken_) return BrokenGroup("gloo", spec_);
    if (group_) return absl::OkStatus();
    auto prefixed = GroupStore(spec_, "");
    if (!prefixed.ok()) {
      broken_ = true;
      return prefixed.status();
    }
    learner::GlooGroupOptions opts;
    opts.timeout_ms = TimeoutMs(spec_);
    opts.threads = 2;
    const bool loopback = spec_.store_host() == "127.0.0.1" || spec_.store_host() == "localhost";
    if (!loopback) {
      char host[256] = {0};
      if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != 0) opts.hostname = host;
    }
    auto group = learner::CreateGlooGroup(*prefixed, spec_.rank(), spec_.world_size(), opts);
    if (!group.ok()) {
      broken_ = true;
      return group.status();
    }
    group_ = *group;
    return absl::OkStatus();
  }

  const WeightSyncSpec spec_;
  c10::intrusive_ptr<c10d::Backend> group_;
  bool broken_ = false;
};

// Waits for the work queued on `stream` with a deadline, polling (a CUDA
// stream has no timed wait). `poll`, called between queries, may fail the
// wait (NCCL's asynchronous error). DEADLINE_EXCEEDED names `what`.
template <typename Poll>
absl::Status SyncStream(const CudaRuntimeApi& cuda, cudaStream_t stream, absl::Time deadline, const std::string& what,
                        Poll poll) {
  for (int spins = 0;; ++spins) {
    const cudaError_t q = cuda.StreamQuery(stream);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return absl::AbortedError(absl::StrCat(what, ": ", cuda.Error("cudaStreamQuery", q)));
    RLMESH_RETURN_IF_ERROR(poll());
    if (absl::Now() > deadline) return absl::DeadlineExceededError(absl::StrCat(what, ": not done by the deadline"));
    // Spin briefly (a bucket copy takes microseconds), then back off.
    if (spins > 100) absl::SleepFor(absl::Microseconds(spins > 1000 ? 200 : 20));
  }
}

// NCCL: rank r uses CUDA device r % device_count (launch one rank per GPU,
// e.g. with CUDA_VISIBLE_DEVICES). Rank 0's ncclUniqueId travels through the
// group's TCPStore (key "nccl_id" under "weight_sync/<group>/nccl"). The
// communicator is non-blocking, so forming it and every broadcast can be
// waited on with a deadline: at the deadline, or on an asynchronous NCCL
// error, the communicator is aborted (ncclCommAbort) and the call returns
// DEADLINE_EXCEEDED / ABORTED. Each broadcast stages its host bytes through
// one device buffer (grown to the largest bucket and kept): H2D on rank 0,
// ncclBroadcast, D2H on the others, all on one stream.
class NcclGroup final : public BroadcastGroup {
 public:
  NcclGroup(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda, const NcclApi* nccl, int device)
      : spec_(spec), cuda_(cuda), nccl_(nccl), device_(device) {}
  ~NcclGroup() override {
    if (cuda_->SetDevice(device_) != cudaSuccess) return;
    // Abort, not destroy: it never waits for the peers.
    if (comm_ != nullptr) nccl_->CommAbort(comm_);
    if (staging_ != nullptr) cuda_->Free(staging_);
    if (stream_ != nullptr) cuda_->StreamDestroy(stream_);
  }

  absl::Status Broadcast(void* data, int64_t bytes) override {
    const absl::Time deadline = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    RLMESH_RETURN_IF_ERROR(Connect(deadline));
    if (bytes == 0) return absl::OkStatus();  // every rank knows the size: skipped alike
    absl::Status s = BroadcastOnce(data, bytes, deadline);
    if (!s.ok()) Fail();
    return s;
  }
  const char* name() const override { return "nccl"; }

 private:
  std::string What() const {
    return absl::StrCat("weight sync (nccl ", spec_.group_name(), " rank ", spec_.rank(), " device ", device_, ")");
  }

  absl::Status CudaCall(const char* call, cudaError_t e) const {
    if (e == cudaSuccess) return absl::OkStatus();
    return absl::AbortedError(absl::StrCat(What(), ": ", cuda_->Error(call, e)));
  }

  // ABORTED on an asynchronous NCCL error; OK while in progress.
  absl::Status PollComm(const char* call) const {
    ncclResult_t r = ncclSuccess;
    const ncclResult_t q = nccl_->CommGetAsyncError(comm_, &r);
    if (q != ncclSuccess) return absl::AbortedError(absl::StrCat(What(), ": ", nccl_->Error("ncclCommGetAsyncError", q, comm_)));
    if (r != ncclSuccess && r != ncclInProgress) {
      return absl::AbortedError(absl::StrCat(What(), ": ", nccl_->Error(call, r, comm_)));
    }
    return absl::OkStatus();
  }

  // A non-blocking communicator may answer ncclInProgress; the next NCCL
  // call must wait until its state is ncclSuccess.
  absl::Status WaitComm(const char* call, ncclResult_t r, absl::Time deadline) const {
    if (r != ncclSuccess && r != ncclInProgress) {
      return absl::AbortedError(absl::StrCat(What(), ": ", nccl_->Error(call, r, comm_)));
    }
    for (int spins = 0;; ++spins) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = nccl_->CommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) {
        return absl::AbortedError(absl::StrCat(What(), ": ", nccl_->Error("ncclCommGetAsyncError", q, comm_)));
      }
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return absl::AbortedError(absl::StrCat(What(), ": ", nccl_->Error(call, state, comm_)));
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(What(), ": ", call, " not done within ", TimeoutMs(spec_), " ms (a rank missing?)"));
      }
      if (spins > 100) absl::SleepFor(absl::Microseconds(200));
    }
  }

  absl::Status Connect(absl::Time deadline) {
    if (broken_) return BrokenGroup("nccl", spec_);
    if (comm_ != nullptr) return absl::OkStatus();
    absl::Status s = ConnectOnce(deadline);
    if (!s.ok()) Fail();
    return s;
  }

  absl::Status ConnectOnce(absl::Time deadline) {
    RLMESH_RETURN_IF_ERROR(CudaCall("cudaSetDevice", cuda_->SetDevice(device_)));
    if (stream_ == nullptr) {
      RLMESH_RETURN_IF_ERROR(
          CudaCall("cudaStreamCreateWithFlags", cuda_->StreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
    }
    RLMESH_ASSIGN_OR_RETURN(auto store, GroupStore(spec_, "/nccl"));
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    try {
      if (spec_.rank() == 0) {
        const ncclResult_t r = nccl_->GetUniqueId(&id);
        if (r != ncclSuccess) return absl::AbortedError(absl::StrCat(What(), ": ", nccl_->Error("ncclGetUniqueId", r, nullptr)));
        const auto* p = reinterpret_cast<const uint8_t*>(&id);
        store->set("nccl_id", std::vector<uint8_t>(p, p + sizeof(id)));
      } else {
        // Blocks up to the store's timeout (spec.timeout_ms).
        const std::vector<uint8_t> got = store->get("nccl_id");
        if (got.size() != sizeof(id)) {
          return absl::DataLossError(absl::StrCat(What(), ": rank 0's NCCL id has ", got.size(), " bytes, want ",
                                                  sizeof(id)));
        }
        std::memcpy(&id, got.data(), sizeof(id));
      }
    } catch (const std::exception& e) {
      return absl::DeadlineExceededError(
          absl::StrCat(What(), ": exchanging the NCCL id through the store failed (rank 0 not there within ",
                       TimeoutMs(spec_), " ms?): ", e.what()));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = nccl_->CommInitRankConfig(&comm_, spec_.world_size(), id, spec_.rank(), &config);
    if (comm_ == nullptr) return absl::AbortedError(absl::StrCat(What(), ": ", nccl_->Error("ncclCommInitRankConfig", r, nullptr)));
    return WaitComm("ncclCommInitRankConfig", r, deadline);
  }

  absl::Status BroadcastOnce(void* data, int64_t bytes, absl::Time deadline) {
    RLMESH_RETURN_IF_ERROR(CudaCall("cudaSetDevice", cuda_->SetDevice(device_)));
    if (bytes > staging_bytes_) {
      if (staging_ != nullptr) cuda_->Free(staging_);
      staging_ = nullptr;
      staging_bytes_ = 0;
      const cudaError_t e = cuda_->Malloc(&staging_, static_cast<size_t>(bytes));
      if (e != cudaSuccess) {
        staging_ = nullptr;
        return absl::ResourceExhaustedError(absl::StrCat(What(), ": ", cuda_->Error("cudaMalloc", e), " for ", bytes, " bytes"));
      }
      staging_bytes_ = bytes;
    }
    const size_t n = static_cast<size_t>(bytes);
    if (spec_.rank() == 0) {
      RLMESH_RETURN_IF_ERROR(
          CudaCall("cudaMemcpyAsync", cuda_->MemcpyAsync(staging_, data, n, cudaMemcpyHostToDevice, stream_)));
    }
    RLMESH_RETURN_IF_ERROR(
        WaitComm("ncclBroadcast", nccl_->Broadcast(staging_, staging_, n, ncclUint8, 0, comm_, stream_), deadline));
    if (spec_.rank() != 0) {
      RLMESH_RETURN_IF_ERROR(
          CudaCall("cudaMemcpyAsync", cuda_->MemcpyAsync(data, staging_, n, cudaMemcpyDeviceToHost, stream_)));
    }
    absl::Status s = SyncStream(*cuda_, stream_, deadline, absl::StrCat(What(), ": broadcast of ", bytes, " bytes"),
                                [&] { return PollComm("ncclBroadcast"); });
    if (absl::IsDeadlineExceeded(s)) {
      return absl::DeadlineExceededError(absl::StrCat(s.message(), " (", TimeoutMs(spec_), " ms; a rank missing?)"));
    }
    return s;
  }

  // Aborting the communicator unblocks the stream (and tells the peers).
  void Fail() {
    broken_ = true;
    if (comm_ != nullptr && cuda_->SetDevice(device_) == cudaSuccess) {
      nccl_->CommAbort(comm_);
      comm_ = nullptr;
    }
  }

  const WeightSyncSpec spec_;
  const CudaRuntimeApi* const cuda_;
  const NcclApi* const nccl_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* staging_ = nullptr;
  int64_t staging_bytes_ = 0;
  bool broken_ = false;
};

class CollectivePublisher final : public WeightPublisher {
 public:
  CollectivePublisher(const WeightSyncSpec& spec, WeightSyncBackend backend, std::unique_ptr<BroadcastGroup> group)
      : spec_(spec), backend_(backend), group_(std::move(group)) {}
  absl::StatusOr<WeightLayout> Publish(const NamedTensors& tensors, int64_t version) override {
    RLMESH_RETURN_IF_ERROR(CheckVersionForward(version, last_));
    RLMESH_ASSIGN_OR_RETURN(WeightLayout layout, BuildLayout(tensors, version, BucketBytes(spec_)));
    // Pack first: once the header is out, receivers wait for every bucket.
    std::vector<at::Tensor> buckets;
    try {
      for (int64_t b : layout.bucket_bytes()) buckets.push_back(at::empty({b}, at::kByte));
      PackInto(tensors, layout, [&](int i) { return buckets[i].data_ptr(); });
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("weight sync (", group_->name(), "): copying tensors: ", e.what()));
    }
    std::string bytes = layout.SerializeAsString();
    int64_t header[2] = {version, static_cast<int64_t>(bytes.size())};
    RLMESH_RETURN_IF_ERROR(group_->Broadcast(header, sizeof(header)));
    RLMESH_RETURN_IF_ERROR(group_->Broadcast(bytes.data(), static_cast<int64_t>(bytes.size())));
    for (auto& b : buckets) RLMESH_RETURN_IF_ERROR(group_->Broadcast(b.data_ptr(), b.numel()));
    last_ = version;
    return layout;
  }
  WeightSyncBackend backend() const override { return backend_; }

 private:
  const WeightSyncSpec spec_;
  const WeightSyncBackend backend_;
  std::unique_ptr<BroadcastGroup> group_;
  int64_t last_ = 0;
};

class CollectiveReceiver final : public WeightReceiver {
 public:
  CollectiveReceiver(const WeightSyncSpec& spec, WeightSyncBackend backend, std::unique_ptr<BroadcastGroup> group)
      : spec_(spec), backend_(backend), group_(std::move(group)) {}
  absl::StatusOr<NamedTensors> Receive(const WeightLayout& expected, WeightLayout* received) override {
    if (expected.version() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("layout.version: must be > 0, got ", expected.version()));
    }
    int64_t header[2] = {0, 0};
    RLMESH_RETURN_IF_ERROR(group_->Broadcast(header, sizeof(header)));
    const int64_t n = header[1];
    if (n <= 0 || n > (int64_t{1} << 30)) {
      return absl::DataLossError(absl::StrCat("weight sync (", group_->name(), "): bad layout size ", n));
    }
    std::string bytes(static_cast<size_t>(n), '\0');
    RLMESH_RETURN_IF_ERROR(group_->Broadcast(bytes.data(), n));
    WeightLayout layout;
    if (!layout.ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat("weight sync (", group_->name(), "): corrupt layout"));
    }
    std::vector<at::Tensor> buckets;
    for (int64_t b : layout.bucket_bytes()) {
      if (b < 0) return absl::DataLossError(absl::StrCat("weight sync (", group_->name(), "): negative bucket size"));
      buckets.push_back(at::empty({b}, at::kByte));
    }
    for (auto& b : buckets) RLMESH_RETURN_IF_ERROR(group_->Broadcast(b.data_ptr(), b.numel()));
    RLMESH_RETURN_IF_ERROR(CheckExpected(expected, layout));
    RLMESH_RETURN_IF_ERROR(ValidateLayout(layout));
    if (received) *received = layout;
    return UnpackFrom(layout, [&](int i) { return buckets[i].data_ptr(); });
  }
  WeightSyncBackend backend() const override { return backend_; }

 private:
  const WeightSyncSpec spec_;
  const WeightSyncBackend backend_;
  std::unique_ptr<BroadcastGroup> group_;
};

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
// -> host; a reader overtaken by the publisher (the slot's word changed
// during the copy) gets ABORTED, as with SHM. In the publisher's own process
// (tests) a handle cannot be opened, so the raw device pointer is used.

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

// FAILED_PRECONDITION "<backend> backend: <what is missing>" unless the CUDA
// runtime loads and sees a device.
absl::StatusOr<const CudaRuntimeApi*> RequireCuda(const char* backend) {
  auto cuda = LoadCudaRuntime();
  if (!cuda.ok()) return absl::FailedPreconditionError(absl::StrCat(backend, " backend: ", cuda.status().message()));
  auto n = CudaDeviceCount();
  if (!n.ok()) return absl::FailedPreconditionError(absl::StrCat(backend, " backend: ", n.status().message()));
  return *cuda;
}

class CudaIpcPublisher final : public WeightPublisher {
 public:
  CudaIpcPublisher(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda)
      : spec_(spec), prefix_(ShmPrefix(spec)), cuda_(cuda) {}
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
    RLMESH_RETURN_IF_ERROR(WriteFileAtomic(IpcManifestPath(prefix_, version), EncodeIpcManifest(m)));
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
    // The learner's rank 0 uses the first visible device.
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
    // The host copies stay alive until the stream is done with them.
    std::vector<at::Tensor> host;
    try {
      for (int i = 0; i < layout.tensors_size(); ++i) {
        const TensorSlot& s = layout.tensors(i);
        host.push_back(HostContiguous(tensors[i].second));
        if (host.back().nbytes() == 0) continue;
        RLMESH_RETURN_IF_ERROR(CudaCall("cudaMemcpyAsync",
                                        cuda_->MemcpyAsync(static_cast<char*>(buffers[s.bucket()].ptr) + s.byte_offset(),
                                                           host.back().data_ptr(), host.back().nbytes(),
                                                           cudaMemcpyHostToDevice, stream_)));
      }
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("weight sync (cuda ipc): copying tensors: ", e.what()));
    }
    absl::Status s = SyncStream(*cuda_, stream_, absl::Now() + absl::Milliseconds(TimeoutMs(spec_)),
                                "weight sync (cuda ipc publisher): host -> device copy", [] { return absl::OkStatus(); });
    if (!s.ok()) broken_ = true;  // the stream may still be writing
    return s;
  }

  const WeightSyncSpec spec_;
  const std::string prefix_;
  const CudaRuntimeApi* const cuda_;
  const int device_ = 0;
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
    NamedTensors out;
    try {
      for (const TensorSlot& slot : m.layout.tensors()) {
        std::vector<int64_t> shape(slot.shape().begin(), slot.shape().end());
        out.emplace_back(slot.name(), at::empty(shape, at::TensorOptions().dtype(*DtypeFromName(slot.dtype()))));
      }
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(absl::StrCat("weight sync (cuda ipc): allocating: ", e.what()));
    }
    RLMESH_RETURN_IF_ERROR(CopyOut(m, out));
    if (received) *received = m.layout;
    return out;
  }

  absl::Status ReceiveInto(const WeightLayout& expected, const NamedTensors& destinations,
                           WeightLayout* received) override {
    RLMESH_ASSIGN_OR_RETURN(IpcManifest m, ReadManifest(expected));
    RLMESH_ASSIGN_OR_RETURN(NamedTensors ordered, OrderDestinations(m.layout, destinations));
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

  // Copies every slot into `out` (layout order), then checks that the
  // publisher did not overwrite the slot meanwhile.
  absl::Status CopyOut(const IpcManifest& m, const NamedTensors& out) {
    if (seq_.data() == nullptr) RLMESH_RETURN_IF_ERROR(seq_.Open(IpcSeqPath(prefix_), 2 * sizeof(int64_t)));
    const WeightLayout& layout = m.layout;
    const int slot = SlotOf(layout.version());
    if (LoadSeq(seq_, slot) != layout.version()) return Torn(layout.version());
    RLMESH_RETURN_IF_ERROR(Open(m, slot));
    const auto& opened = opened_[slot];
    for (int i = 0; i < layout.tensors_size(); ++i) {
      const TensorSlot& s = layout.tensors(i);
      const at::Tensor& dst = out[i].second;
      if (dst.nbytes() == 0) continue;
      RLMESH_RETURN_IF_ERROR(CudaCall(
          "cudaMemcpyAsync", cuda_->MemcpyAsync(dst.data_ptr(), static_cast<const char*>(opened[s.bucket()].ptr) + s.byte_offset(),
                                                dst.nbytes(), cudaMemcpyDeviceToHost, stream_)));
    }
    RLMESH_RETURN_IF_ERROR(SyncStream(*cuda_, stream_, absl::Now() + absl::Milliseconds(TimeoutMs(spec_)),
                                      "weight sync (cuda ipc receiver): device -> host copy",
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

// The GLOO or NCCL group of `spec`. NCCL: FAILED_PRECONDITION naming the
// missing library or device; nothing connects yet (groups form lazily).
absl::StatusOr<std::unique_ptr<BroadcastGroup>> MakeBroadcastGroup(const WeightSyncSpec& spec) {
  if (ResolveBackend(spec) == WEIGHT_SYNC_GLOO) return std::unique_ptr<BroadcastGroup>(new GlooGroup(spec));
  auto nccl = LoadNccl();
  if (!nccl.ok()) return absl::FailedPreconditionError(absl::StrCat("NCCL backend: ", nccl.status().message()));
  RLMESH_ASSIGN_OR_RETURN(const CudaRuntimeApi* cuda, RequireCuda("NCCL"));
  RLMESH_ASSIGN_OR_RETURN(int devices, CudaDeviceCount());
  return std::unique_ptr<BroadcastGroup>(new NcclGroup(spec, cuda, *nccl, spec.rank() % devices));
}

}  // namespace

absl::Status WeightReceiver::ReceiveInto(const WeightLayout& expected, const NamedTensors& destinations,
                                         WeightLayout* received) {
  WeightLayout layout;
  RLMESH_ASSIGN_OR_RETURN(NamedTensors got, Receive(expected, &layout));
  RLMESH_ASSIGN_OR_RETURN(NamedTensors ordered, OrderDestinations(layout, destinations));
  for (size_t i = 0; i < got.size(); ++i) ordered[i].second.copy_(got[i].second);
  if (received) *received = layout;
  return absl::OkStatus();
}

absl::Status ValidateSpec(const WeightSyncSpec& spec) {
  if (spec.timeout_ms() < 0) return absl::InvalidArgumentError("spec.timeout_ms: must be >= 0");
  if (spec.bucket_mb() < 0) return absl::InvalidArgumentError("spec.bucket_mb: must be >= 0");
  if (!WeightSyncBackend_IsValid(spec.backend())) return absl::InvalidArgumentError("spec.backend: unknown value");
  const WeightSyncBackend backend = ResolveBackend(spec);
  if (backend == WEIGHT_SYNC_GLOO || backend == WEIGHT_SYNC_NCCL) {
    if (spec.store_host().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.store_host: required for ", WeightSyncBackend_Name(backend)));
    }
    if (spec.store_port() <= 0 || spec.store_port() > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("spec.store_port: invalid ", spec.store_port()));
    }
    if (spec.world_size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.world_size: must be >= 2 (publisher + receivers), got ", spec.world_size()));
    }
    if (spec.rank() < 0 || spec.rank() >= spec.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.rank: must be in [0, ", spec.world_size(), "), got ", spec.rank()));
    }
  }
  return absl::OkStatus();
}

WeightSyncBackend ResolveBackend(const WeightSyncSpec& spec) {
  if (spec.backend() != WEIGHT_SYNC_AUTO) return spec.backend();
  const std::string& h = spec.store_host();
  const bool one_host = h.empty() || h == "127.0.0.1" || h == "localhost" || h == "::1";
  return one_host ? WEIGHT_SYNC_SHM : WEIGHT_SYNC_GLOO;
}

absl::StatusOr<std::string> DtypeName(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return std::string("f32");
    case at::kBFloat16: return std::string("bf16");
    case at::kHalf: return std::string("f16");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype: unsupported ", c10::toString(t.scalar_type()), " (f32, bf16, f16)"));
  }
}

absl::StatusOr<WeightLayout> BuildLayout(const NamedTensors& tensors, int64_t version, int64_t bucket_bytes) {
  if (tensors.empty()) return absl::InvalidArgumentError("tensors: must not be empty");
  if (bucket_bytes <= 0) return absl::InvalidArgumentError("bucket_bytes: must be > 0");
  WeightLayout layout;
  layout.set_version(version);
  std::set<std::string> seen;
  int64_t used = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    if (name.empty()) return absl::InvalidArgumentError(absl::StrCat("tensors[", i, "].name: must not be empty"));
    if (!seen.insert(name).second) return absl::InvalidArgumentError(absl::StrCat("tensors: duplicate name ", name));
    if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat("tensors[", name, "]: undefined tensor"));
    auto dtype = DtypeName(t);
    if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("tensors[", name, "].", dtype.status().message()));
    const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
    int64_t offset = AlignUp(used);
    if (layout.bucket_bytes_size() == 0 || (used > 0 && offset + nbytes > bucket_bytes)) {
      if (layout.bucket_bytes_size() > 0) layout.set_bucket_bytes(layout.bucket_bytes_size() - 1, used);
      layout.add_bucket_bytes(0);
      offset = 0;
    }
    TensorSlot* slot = layout.add_tensors();
    slot->set_name(name);
    for (int64_t d : t.sizes()) slot->add_shape(d);
    slot->set_dtype(*dtype);
    slot->set_byte_offset(offset);
    slot->set_bucket(layout.bucket_bytes_size() - 1);
    used = offset + nbytes;
  }
  layout.set_bucket_bytes(layout.bucket_bytes_size() - 1, used);
  return layout;
}

absl::Status ValidateLayout(const WeightLayout& layout) {
  std::set<std::string> seen;
  for (int i = 0; i < layout.bucket_bytes_size(); ++i) {
    if (layout.bucket_bytes(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("layout.bucket_bytes[", i, "]: negative"));
    }
  }
  for (const TensorSlot& slot : layout.tensors()) {
    auto dtype = DtypeFromName(slot.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("layout.tensors[", slot.name(), "].", dtype.status().message()));
    }
    if (!seen.insert(slot.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("layout.tensors: duplicate name ", slot.name()));
    }
    for (int64_t d : slot.shape()) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("layout.tensors[", slot.name(), "].shape: negative"));
    }
    if (slot.bucket() < 0 || slot.bucket() >= layout.bucket_bytes_size()) {
      return absl::InvalidArgumentError(absl::StrCat("layout.tensors[", slot.name(), "].bucket: ", slot.bucket(),
                                                     " outside [0, ", layout.bucket_bytes_size(), ")"));
    }
    const int64_t end = slot.byte_offset() + SlotBytes(slot, *dtype);
    if (slot.byte_offset() < 0 || end > layout.bucket_bytes(slot.bucket())) {
      return absl::InvalidArgumentError(absl::StrCat("layout.tensors[", slot.name(), "]: bytes [", slot.byte_offset(),
                                                     ", ", end, ") outside bucket ", slot.bucket(), " of ",
                                                     layout.bucket_bytes(slot.bucket()), " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WeightPublisher>> CreateWeightPublisher(const WeightSyncSpec& spec) {
  RLMESH_RETURN_IF_ERROR(ValidateSpec(spec));
  switch (ResolveBackend(spec)) {
    case WEIGHT_SYNC_SHM: return std::unique_ptr<WeightPublisher>(new ShmPublisher(spec));
    case WEIGHT_SYNC_IN_PROCESS: return std::unique_ptr<WeightPublisher>(new InProcessPublisher(spec));
    case WEIGHT_SYNC_GLOO:
    case WEIGHT_SYNC_NCCL: {
      if (spec.rank() != 0) {
        return absl::InvalidArgumentError(absl::StrCat("spec.rank: the publisher is rank 0, got ", spec.rank()));
      }
      RLMESH_ASSIGN_OR_RETURN(auto group, MakeBroadcastGroup(spec));
      return std::unique_ptr<WeightPublisher>(new CollectivePublisher(spec, ResolveBackend(spec), std::move(group)));
    }
    case WEIGHT_SYNC_CUDA_IPC: {
      RLMESH_ASSIGN_OR_RETURN(const CudaRuntimeApi* cuda, RequireCuda("CUDA_IPC"));
      return std::unique_ptr<WeightPublisher>(new CudaIpcPublisher(spec, cuda));
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.backend: ", WeightSyncBackend_Name(ResolveBackend(spec)), " has no publisher"));
  }
}

absl::StatusOr<std::unique_ptr<WeightReceiver>> CreateWeightReceiver(const WeightSyncSpec& spec) {
  RLMESH_RETURN_IF_ERROR(ValidateSpec(spec));
  switch (ResolveBackend(spec)) {
    case WEIGHT_SYNC_SHM: return std::unique_ptr<WeightReceiver>(new ShmReceiver(spec));
    case WEIGHT_SYNC_IN_PROCESS: return std::unique_ptr<WeightReceiver>(new InProcessReceiver(spec));
    case WEIGHT_SYNC_GLOO:
    case WEIGHT_SYNC_NCCL: {
      if (spec.rank() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec.rank: receivers are ranks 1..", spec.world_size() - 1, ", got ", spec.rank()));
      }
      RLMESH_ASSIGN_OR_RETURN(auto group, MakeBroadcastGroup(spec));
      return std::unique_ptr<WeightReceiver>(new CollectiveReceiver(spec, ResolveBackend(spec), std::move(group)));
    }
    case WEIGHT_SYNC_CUDA_IPC: {
      RLMESH_ASSIGN_OR_RETURN(const CudaRuntimeApi* cuda, RequireCuda("CUDA_IPC"));
      return std::unique_ptr<WeightReceiver>(new CudaIpcReceiver(spec, cuda));
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.backend: ", WeightSyncBackend_Name(ResolveBackend(spec)), " has no receiver"));
  }
}

struct WeightSyncStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

WeightSyncStore::WeightSyncStore(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}
WeightSyncStore::~WeightSyncStore() = default;

absl::StatusOr<std::unique_ptr<WeightSyncStore>> WeightSyncStore::Host(const std::string& host, int port,
                                                                      int world_size, int64_t timeout_ms) {
  RLMESH_ASSIGN_OR_RETURN(auto store, learner::MakeTcpStore(host, port, /*is_server=*/true, world_size, timeout_ms));
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  const int bound = static_cast<int>(store->getPort());
  return std::unique_ptr<WeightSyncStore>(new WeightSyncStore(std::move(impl), bound));
}

}  // namespace rlmesh::rollout
