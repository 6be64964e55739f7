#pragma once

// Helpers that make every callback-API handler check auth first, catch
// LibTorch/STL exceptions, and finish the RPC exactly once.
//
//   grpc::ServerUnaryReactor* Foo(grpc::CallbackServerContext* ctx,
//                                 const FooRequest* req, FooReply* rep) override {
//     return HandleUnary(ctx, auth_, [&]() -> absl::Status { ... });
//   }

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"

namespace rlmesh {

// Runs `fn` (an absl::Status()) inline on the gRPC callback thread. Use it for
// work that does not block for long.
template <typename Fn>
grpc::ServerUnaryReactor* HandleUnary(grpc::CallbackServerContext* context,
                                      const ServerAuth& auth, Fn&& fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = auth.Check(*context);
  if (status.ok()) {
    try {
      status = std::forward<Fn>(fn)();
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
    }
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A server-streaming reactor that refuses the call (auth failure or a
// not-yet-implemented method) and finishes it exactly once.
template <typename Response>
class FailedWriteReactor : public grpc::ServerWriteReactor<Response> {
 public:
  explicit FailedWriteReactor(const absl::Status& status) {
    this->Finish(ToGrpcStatus(status));
  }
  void OnDone() override { delete this; }
};

}  // namespace rlmesh
