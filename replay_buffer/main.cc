// replay_buffer: the durable trajectory store (RocksDB) behind the
// ReplayBuffer RPC.
#include <cstdio>

#include "common/rpc_handler.h"
#include "common/server_flags.h"
#include "proto/replay_buffer.grpc.pb.h"

namespace rlmesh {
namespace {

// Placeholder until the RocksDB store lands: every data method answers
// UNIMPLEMENTED (the generated default); Stats answers honestly: nothing stored.
class ReplayBufferServiceImpl final : public ReplayBuffer::CallbackService {
 public:
  explicit ReplayBufferServiceImpl(const ServerAuth* auth) : auth_(auth) {}
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const StatsRequest*,
                                  StatsResponse*) override {
    return HandleUnary(ctx, *auth_, [] { return absl::OkStatus(); });
  }

 private:
  const ServerAuth* auth_;
};

}  // namespace
}  // namespace rlmesh

int main(int argc, char** argv) {
  rlmesh::InitServerProcess(argc, argv, "replay_buffer",
                            "replay_buffer --port=0 --port_file=PATH [--db_path=DIR]");
  auto options = rlmesh::ServerOptionsFromFlags("replay_buffer");
  if (!options.ok()) {
    std::fprintf(stderr, "replay_buffer: %s\n", options.status().ToString().c_str());
    return 2;
  }
  rlmesh::RpcServer server(*options);
  rlmesh::ReplayBufferServiceImpl service(&server.auth());
  server.AddService(&service);
  return rlmesh::ServeUntilSignal(server);
}
