#include "weight_sync/internal.h"

#include <algorithm>

#include "common/log.h"
#include "weight_sync/shm_files.h"

namespace rlmesh::weight_sync::internal {
namespace {

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
    RLMESH_RETURN_IF_ERROR(WriteManifest(ManifestPath(prefix_, version), layout.SerializeAsString()));
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

}  // namespace

std::unique_ptr<WeightPublisher> NewShmPublisher(const WeightSyncSpec& spec) {
  return std::make_unique<ShmPublisher>(spec);
}

std::unique_ptr<WeightReceiver> NewShmReceiver(const WeightSyncSpec& spec) {
  return std::make_unique<ShmReceiver>(spec);
}

}  // namespace rlmesh::weight_sync::internal
