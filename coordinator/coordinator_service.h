#pragma once

// The Coordinator RPC: a thin adapter over the cluster and the registry of
// roles that registered themselves (roles placed by hand or by Slurm).

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "coordinator/cluster.h"
#include "coordinator/experiments.h"
#include "coordinator/registry.h"
#include "proto/coordinator.grpc.pb.h"

namespace rlmesh {

// Safe for concurrent use.
class CoordinatorServiceImpl final : public Coordinator::CallbackService {
 public:
  // `cluster` and `experiments` may be null (a coordinator that launched
  // nothing cannot run experiments). `registry` holds the roles that
  // Register; null = one of the service's own. None is owned.
  CoordinatorServiceImpl(const ServerAuth* auth, Cluster* cluster, ExperimentManager* experiments,
                         Registry* registry = nullptr)
      : auth_(auth),
        cluster_(cluster),
        experiments_(experiments),
        own_registry_(registry == nullptr ? std::make_unique<Registry>() : nullptr),
        registry_(registry == nullptr ? own_registry_.get() : registry) {}

  // Sets the experiments once the cluster they run on is up (a Slurm cluster
  // registers through this service first). Safe while serving.
  void SetExperiments(ExperimentManager* experiments) { experiments_.store(experiments); }

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const SubmitRequest* req,
                                   SubmitResponse* resp) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx, const StatusRequest* req,
                                      StatusResponse* resp) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const ListRequest* req,
                                 ListResponse* resp) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* ctx, const CancelRequest* req,
                                   CancelResponse* resp) override;
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const RegisterRequest* req,
                                     RegisterResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const HeartbeatRequest* req,
                                      HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* ctx, const MetricsRequest* req,
                                       MetricsResponse* resp) override;

 private:
  const ServerAuth* const auth_;
  Cluster* const cluster_;
  std::atomic<ExperimentManager*> experiments_;
  const std::unique_ptr<Registry> own_registry_;
  // Safe for concurrent use (Registry is).
  Registry* const registry_;
};

}  // namespace rlmesh
