#include "environment/client.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "proto/environment.grpc.pb.h"

namespace rlmesh {
namespace {

// Immutable after construction; the stub and channel are thread-safe.
class GrpcEnvironmentClient final : public EnvironmentClient {
 public:
  explicit GrpcEnvironmentClient(RpcClient client)
      : client_(std::move(client)), stub_(EnvironmentService::NewStub(client_.channel())) {}

  absl::StatusOr<ResetResponse> Reset(const ResetRequest& request, absl::Duration timeout) override {
    ResetResponse resp;
    auto ctx = client_.NewContext(timeout);
    absl::Status s = FromGrpcStatus(stub_->Reset(ctx.get(), request, &resp));
    if (!s.ok()) return Named("Reset", s);
    return resp;
  }

  absl::StatusOr<StepResponse> Step(const StepRequest& request, absl::Duration timeout) override {
    StepResponse resp;
    auto ctx = client_.NewContext(timeout);
    absl::Status s = FromGrpcStatus(stub_->Step(ctx.get(), request, &resp));
    if (!s.ok()) return Named("Step", s);
    return resp;
  }

  absl::Status Close(const CloseRequest& request, absl::Duration timeout) override {
    CloseResponse resp;
    auto ctx = client_.NewContext(timeout);
    absl::Status s = FromGrpcStatus(stub_->Close(ctx.get(), request, &resp));
    return s.ok() ? s : Named("Close", s);
  }

 private:
  absl::Status Named(const char* method, const absl::Status& s) const {
    return absl::Status(s.code(), absl::StrCat("environment server ", client_.address(), " ", method, ": ", s.message()));
  }
  RpcClient client_;
  std::unique_ptr<EnvironmentService::Stub> stub_;
};

}  // namespace

std::unique_ptr<EnvironmentClient> MakeGrpcEnvironmentClient(RpcClient client) {
  return std::make_unique<GrpcEnvironmentClient>(std::move(client));
}

}  // namespace rlmesh
