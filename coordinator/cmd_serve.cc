// `coordinator serve`: the Coordinator RPC without launching roles; also
// the end of `launch` of a local cluster, which serves the roles it started.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "common/atomic_file.h"
#include "common/log.h"
#include "common/rpc_server.h"
#include "common/server_flags.h"
#include "coordinator/cli.h"
#include "coordinator/coordinator_service.h"

namespace rlmesh {

int Serve(Cluster* cluster, int port_override) {
  auto options = ServerOptionsFromFlags("coordinator");
  if (!options.ok()) return Fail("serve", options.status());
  if (port_override > 0 && options->port == 0) options->port = port_override;
  // The cluster's token guards the coordinator's own RPCs too (a cluster
  // YAML with auth_token_file and no --auth_token_file left them open).
  if (cluster != nullptr && options->auth_token.empty()) options->auth_token = cluster->token();
  std::unique_ptr<ExperimentManager> experiments;
  if (cluster != nullptr) {
    ClusterAddresses addresses =
        AddressesOf(*cluster, options->auth_token, cluster->options().run_dir + "/experiments");
    addresses.reward_commands = AllowedCommandPrograms();
    experiments = std::make_unique<ExperimentManager>(std::move(addresses));
  }
  ClusterServices services;
  if (experiments != nullptr) {
    absl::Status s = StartClusterServices(experiments.get(), [cluster] { return cluster->Roles(); },
                                          AddressesOf(*cluster, options->auth_token, ""), *options,
                                          cluster->options().run_dir, &services);
    if (!s.ok()) return Fail("serve", s);
  }
  RpcServer server(*options);
  CoordinatorServiceImpl service(&server.auth(), cluster, experiments.get());
  server.AddService(&service);
  absl::Status started = server.Start();
  if (!started.ok()) return Fail("serve", started);
  if (cluster != nullptr) {
    WriteFileAtomically(cluster->options().run_dir + "/coordinator.address", server.address() + "\n")
        .IgnoreError();
    std::printf("rlmesh: cluster up (coordinator %s)\n", server.address().c_str());
    std::fflush(stdout);  // before the health table, which waits on every role
    const auto roles = cluster->Roles();
    PrintRoles(roles);
    if (absl::GetFlag(FLAGS_exit_after_health)) {
      bool all = true;
      for (const auto& r : roles) all = all && r.health() == "SERVING";
      server.Shutdown();
      cluster->Stop();
      std::printf("rlmesh: cluster stopped (%s)\n", all ? "all roles were serving" : "some roles were NOT serving");
      return all ? 0 : 1;
    }
  }
  const int sig = WaitForTerminationSignal();
  RLMESH_LOG(INFO) << "signal=" << sig << " shutting down";
  if (experiments) experiments->Shutdown();
  server.Shutdown();
  if (cluster != nullptr) cluster->Stop();
  return 0;
}

}  // namespace rlmesh
