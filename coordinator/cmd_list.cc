// `coordinator list`: the experiments a running coordinator knows.
#include <cstdio>
#include <string>
#include <vector>

#include "common/grpc_status.h"
#include "coordinator/cli.h"
#include "proto/coordinator.grpc.pb.h"

namespace rlmesh {

int List() {
  auto client = CliClient();
  if (!client.ok()) return Fail("list", client.status());
  auto stub = Coordinator::NewStub(client->channel());
  ListResponse resp;
  auto ctx = client->NewContext();
  grpc::Status s = stub->List(ctx.get(), ListRequest(), &resp);
  if (!s.ok()) return Fail("list", FromGrpcStatus(s));
  std::printf("%-28s %-10s %-10s %s\n", "ID", "STATE", "STAGE", "STEP");
  for (const auto& e : resp.experiments()) {
    std::printf("%-28s %-10s %-10s %lld/%lld\n", e.experiment_id().c_str(), e.state().c_str(),
                e.stage().c_str(), static_cast<long long>(e.step()), static_cast<long long>(e.total_steps()));
  }
  return 0;
}

}  // namespace rlmesh
