#include "weight_sync/internal.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "dist/gloo.h"
#include "dist/store.h"

namespace rlmesh::weight_sync::internal {
namespace {


class GlooGroup final : public BroadcastGroup {
 public:
  explicit GlooGroup(const WeightSyncSpec& spec) : spec_(spec) {}

  c10::Device device() const override { return c10::Device(c10::kCPU); }

  // The broadcast runs on the group's own threads while the caller packs
  // or unpacks the other buffer.
  absl::Status Start(const at::Tensor& bucket) override {
    RLMESH_RETURN_IF_ERROR(Connect());
    try {
      std::vector<at::Tensor> v{bucket};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      opts.timeout = std::chrono::milliseconds(TimeoutMs(spec_));
      work_ = group_->broadcast(v, opts);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return Failed(e);
    }
  }

  absl::Status Wait() override {
    if (!work_) return absl::OkStatus();
    auto work = std::move(work_);
    try {
      work->wait();  // bounded by the broadcast's timeout
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return Failed(e);
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
    dist::GlooGroupOptions opts;
    opts.timeout_ms = TimeoutMs(spec_);
    opts.threads = 2;
    const bool loopback = spec_.store_host() == "127.0.0.1" || spec_.store_host() == "localhost";
    if (!loopback) {
      char host[256] = {0};
      if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != 0) opts.hostname = host;
    }
    auto group = dist::CreateGlooGroup(*prefixed, spec_.rank(), spec_.world_size(), opts);
    if (!group.ok()) {
      broken_ = true;
      return group.status();
    }
    group_ = *group;
    return absl::OkStatus();
  }

  absl::Status Failed(const std::exception& e) {
    broken_ = true;
    return absl::AbortedError(absl::StrCat("weight sync (gloo ", spec_.group_name(), " rank ", spec_.rank(),
                                           "): broadcast failed: ", e.what()));
  }

  const WeightSyncSpec spec_;
  c10::intrusive_ptr<c10d::Backend> group_;
  c10::intrusive_ptr<c10d::Work> work_;
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<BroadcastGroup> NewGlooGroup(const WeightSyncSpec& spec) {
  return std::make_unique<GlooGroup>(spec);
}

}  // namespace rlmesh::weight_sync::internal
