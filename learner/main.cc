// learner: serves the Learner RPC.
#include <cstdio>

#include "common/rpc_handler.h"
#include "common/server_flags.h"
#include "proto/learner.grpc.pb.h"

namespace rlmesh {
namespace {

// Placeholder until the engine lands: data methods answer UNIMPLEMENTED (the
// generated default); GetStatus answers honestly with an idle status.
class ServiceImpl final : public Learner::CallbackService {
 public:
  explicit ServiceImpl(const ServerAuth* auth) : auth_(auth) {}
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx, const LearnerStatusRequest*,
                                      LearnerStatus*) override {
    return HandleUnary(ctx, *auth_, [] { return absl::OkStatus(); });
  }

 private:
  const ServerAuth* auth_;
};

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  rlmesh::InitServerProcess(argc, argv, "learner", "learner --port=0 --port_file=PATH");
  auto options = rlmesh::ServerOptionsFromFlags("learner");
  if (!options.ok()) {
    std::fprintf(stderr, "learner: %s\n", options.status().ToString().c_str());
    return 2;
  }
  rlmesh::RpcServer server(*options);
  rlmesh::ServiceImpl service(&server.auth());
  server.AddService(&service);
  return rlmesh::ServeUntilSignal(server);
}
