// `coordinator status [ID]`: an experiment's progress and the health of
// every role, from a running coordinator.
#include <cstdio>
#include <string>
#include <vector>

#include "common/grpc_status.h"
#include "coordinator/cli.h"
#include "proto/coordinator.grpc.pb.h"

namespace rlmesh {

int Status(const std::vector<std::string>& args) {
  auto client = CliClient();
  if (!client.ok()) return Fail("status", client.status());
  auto stub = Coordinator::NewStub(client->channel());
  StatusRequest req;
  if (!args.empty()) req.set_experiment_id(args[0]);
  StatusResponse resp;
  auto ctx = client->NewContext();
  grpc::Status s = stub->GetStatus(ctx.get(), req, &resp);
  if (!s.ok()) return Fail("status", FromGrpcStatus(s));
  if (resp.has_experiment()) {
    const auto& e = resp.experiment();
    std::printf("experiment %s: %s stage=%s step=%lld/%lld phase=%s\n", e.experiment_id().c_str(),
                e.state().c_str(), e.stage().c_str(), static_cast<long long>(e.step()),
                static_cast<long long>(e.total_steps()), e.phase().c_str());
    for (const auto& [k, v] : e.metrics()) std::printf("  %-24s %g\n", k.c_str(), v);
  }
  PrintRoles({resp.roles().begin(), resp.roles().end()});
  return 0;
}

}  // namespace rlmesh
