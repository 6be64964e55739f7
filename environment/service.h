#pragma once

// EnvironmentService over an EpisodeTable: a thin adapter. Reset and Close
// answer on the callback thread; Step (which may run the sandboxed
// evaluator for up to its wall limit) runs on a pool of step threads, so a
// slow tool call never holds a gRPC callback thread.

#include "common/auth.h"
#include "common/thread_pool.h"
#include "environment/episode_table.h"
#include "proto/environment.grpc.pb.h"

namespace rlmesh::environment {

// Safe for concurrent use. Neither pointer is owned; both outlive the
// service. Destroy the service after the server has shut down.
class EnvironmentServiceImpl final : public EnvironmentService::CallbackService {
 public:
  EnvironmentServiceImpl(const ServerAuth* auth, EpisodeTable* table, int step_threads = 8)
      : auth_(auth), table_(table), steps_(step_threads, "env-step") {}

  grpc::ServerUnaryReactor* Reset(grpc::CallbackServerContext* ctx, const ResetRequest* req,
                                  ResetResponse* resp) override;
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* ctx, const StepRequest* req,
                                 StepResponse* resp) override;
  grpc::ServerUnaryReactor* Close(grpc::CallbackServerContext* ctx, const CloseRequest* req,
                                  CloseResponse* resp) override;

 private:
  const ServerAuth* const auth_;
  EpisodeTable* const table_;
  ThreadPool steps_;
};

}  // namespace rlmesh::environment
