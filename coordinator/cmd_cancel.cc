// `coordinator cancel ID`: cancels an experiment on a running coordinator.
#include <cstdio>
#include <string>
#include <vector>

#include "common/grpc_status.h"
#include "coordinator/cli.h"
#include "proto/coordinator.grpc.pb.h"

namespace rlmesh {

int Cancel(const std::vector<std::string>& args) {
  if (args.size() != 1) return Fail("cancel", absl::InvalidArgumentError("expected one experiment id"));
  auto client = CliClient();
  if (!client.ok()) return Fail("cancel", client.status());
  auto stub = Coordinator::NewStub(client->channel());
  CancelRequest req;
  req.set_experiment_id(args[0]);
  CancelResponse resp;
  auto ctx = client->NewContext();
  grpc::Status s = stub->Cancel(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("cancel", FromGrpcStatus(s));
  std::printf("%s: %s\n", args[0].c_str(), resp.state().c_str());
  return 0;
}

}  // namespace rlmesh
