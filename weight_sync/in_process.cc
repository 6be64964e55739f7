#include "weight_sync/internal.h"

#include <map>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace rlmesh::weight_sync::internal {
namespace {

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
    // Read under the lock, which is still held while UnpackFrom copies out.
    std::vector<const char*> data;
    for (const std::vector<char>& bucket : g.buckets) data.push_back(bucket.data());
    return UnpackFrom(g.layout, [&](int i) { return data[i]; });
  }
  WeightSyncBackend backend() const override { return WEIGHT_SYNC_IN_PROCESS; }

 private:
  const WeightSyncSpec spec_;
};

}  // namespace

std::unique_ptr<WeightPublisher> NewInProcessPublisher(const WeightSyncSpec& spec) {
  return std::make_unique<InProcessPublisher>(spec);
}

std::unique_ptr<WeightReceiver> NewInProcessReceiver(const WeightSyncSpec& spec) {
  return std::make_unique<InProcessReceiver>(spec);
}

}  // namespace rlmesh::weight_sync::internal
