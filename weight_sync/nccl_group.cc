#include "weight_sync/internal.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "dist/store.h"

namespace rlmesh::weight_sync::internal {
namespace {

// NCCL: each rank uses its own process's device (spec.device, CudaDeviceOf;
// one rank per GPU). Rank 0's ncclUniqueId travels through the
// group's TCPStore (key "nccl_id" under "weight_sync/<group>/nccl"). The
// communicator is non-blocking, so forming it and every broadcast can be
// waited on with a deadline: at the deadline, or on an asynchronous NCCL
// error, the communicator is aborted (ncclCommAbort) and the call returns
// DEADLINE_EXCEEDED / ABORTED. The buckets are device tensors (LibTorch's
// allocator, on this rank's GPU): ncclBroadcast reads and writes them in
// place on the group's own stream, so nothing is staged through the host.
//
// Ordering with LibTorch's work, by events: the group's stream is its own
// (so a broadcast runs beside the next bucket's packing), and Start makes it
// wait, on the device, for what the calling thread's LibTorch queued so far
// on its current stream (the copy into the bucket, or the unpacking of the
// bucket it reuses); the host does not wait there. Wait returns once the
// broadcast is done on the device (an event after it, polled by the
// deadline).
class NcclGroup final : public BroadcastGroup {
 public:
  NcclGroup(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda, const NcclApi* nccl, int device)
      : spec_(spec), cuda_(cuda), nccl_(nccl), device_(device) {}
  ~NcclGroup() override {
    if (cuda_->SetDevice(device_) != cudaSuccess) return;
    // Abort, not destroy: it never waits for the peers.
    if (comm_ != nullptr) nccl_->CommAbort(comm_);
    if (stream_ != nullptr) cuda_->StreamDestroy(stream_);
  }

  c10::Device device() const override { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_)); }

  absl::Status Start(const at::Tensor& bucket) override {
    deadline_ = absl::Now() + absl::Milliseconds(TimeoutMs(spec_));
    RLMESH_RETURN_IF_ERROR(Connect(deadline_));
    if (bucket.numel() == 0) return absl::OkStatus();  // every rank knows the size: skipped alike
    absl::Status s = StartOnce(bucket);
    if (!s.ok()) Fail();
    return s;
  }

  absl::Status Wait() override {
    if (!in_flight_) return absl::OkStatus();
    in_flight_ = false;
    absl::Status s = CudaCall("cudaSetDevice", cuda_->SetDevice(device_));
    if (s.ok()) {
      s = WaitStream(*cuda_, stream_, deadline_, absl::StrCat(What(), ": broadcast of ", in_flight_bytes_, " bytes"),
                     [&] { return PollComm("ncclBroadcast"); });
    }
    if (absl::IsDeadlineExceeded(s)) {
      s = absl::DeadlineExceededError(absl::StrCat(s.message(), " (", TimeoutMs(spec_), " ms; a rank missing?)"));
    }
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
    // Only `blocking` is set, which NCCL 2.14 has (dist::kMinNcclVersion).
    // The initializer stamps the size and version of the header's struct; a
    // library older than the header copies the prefix its own struct spans,
    // so it takes this config as it is.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t r = nccl_->CommInitRankConfig(&comm_, spec_.world_size(), id, spec_.rank(), &config);
    if (comm_ == nullptr) return absl::AbortedError(absl::StrCat(What(), ": ", nccl_->Error("ncclCommInitRankConfig", r, nullptr)));
    return WaitComm("ncclCommInitRankConfig", r, deadline);
  }

  absl::Status StartOnce(const at::Tensor& bucket) {
    if (!bucket.is_contiguous() || bucket.scalar_type() != at::kByte || bucket.device() != device()) {
      return absl::InternalError(absl::StrCat(What(), ": a bucket must be a contiguous byte tensor on ",
                                              device().str(), ", got ", bucket.device().str()));
    }
    RLMESH_RETURN_IF_ERROR(CudaCall("cudaSetDevice", cuda_->SetDevice(device_)));
    RLMESH_RETURN_IF_ERROR(
        StreamAfterTorch(*cuda_, device_, stream_, absl::StrCat(What(), ": LibTorch's copies before a broadcast")));
    void* data = bucket.data_ptr();
    const size_t n = static_cast<size_t>(bucket.numel());
    RLMESH_RETURN_IF_ERROR(WaitComm("ncclBroadcast", nccl_->Broadcast(data, data, n, ncclUint8, 0, comm_, stream_),
                                    deadline_));
    in_flight_ = true;
    in_flight_bytes_ = bucket.numel();
    return absl::OkStatus();
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
  absl::Time deadline_;  // of the broadcast in flight
  bool in_flight_ = false;
  int64_t in_flight_bytes_ = 0;
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<BroadcastGroup> NewNcclGroup(const WeightSyncSpec& spec, const CudaRuntimeApi* cuda,
                                             const NcclApi* nccl, int device) {
  return std::make_unique<NcclGroup>(spec, cuda, nccl, device);
}

}  // namespace rlmesh::weight_sync::internal
