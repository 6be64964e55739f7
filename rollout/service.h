#pragma once

// RolloutServiceImpl: the gRPC adapter over RolloutWorker. Every method
// checks auth first and finishes its call exactly once. Generate is a
// server-streaming reactor that writes each group as the worker hands it
// over (one write in flight, the rest queued) and finishes after the last
// one with the request's status; a cancelled call cancels the request.
// LoadWeights blocks until the weights are swapped in at the fence, so it
// runs on a thread of its own instead of a gRPC callback thread.

#include <functional>
#include <list>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "proto/rollout.grpc.pb.h"
#include "rollout/rollout_worker.h"

namespace rlmesh::rollout {

// The worker and auth are not owned and must outlive the service; destroy
// the service after the server has shut down.
class RolloutServiceImpl final : public RolloutService::CallbackService {
 public:
  RolloutServiceImpl(RolloutWorker* worker, const ServerAuth* auth) : worker_(worker), auth_(auth) {}
  ~RolloutServiceImpl() override;  // joins the OffThread threads

  grpc::ServerWriteReactor<GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                        const GenerateRequest* request) override;
  grpc::ServerUnaryReactor* LoadWeights(grpc::CallbackServerContext* ctx, const LoadWeightsRequest* request,
                                        LoadWeightsResponse* response) override;
  grpc::ServerUnaryReactor* ConfigureWeightSync(grpc::CallbackServerContext* ctx,
                                                const ConfigureWeightSyncRequest* request,
                                                ConfigureWeightSyncResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx, const RolloutStatusRequest* request,
                                      RolloutStatus* response) override;
  // Waits for the engine's fence off the callback thread, like LoadWeights.
  grpc::ServerUnaryReactor* Sleep(grpc::CallbackServerContext* ctx, const SleepRequest* request,
                                  SleepResponse* response) override;

 private:
  // A call that may wait (for the engine's fence, a load in progress, a
  // sync's store): checks the caller's token, then `valid` (the request's
  // own checks), then runs `work` with the call's deadline on a thread of
  // its own and finishes the call with its status (exceptions become
  // INTERNAL), so the callback threads stay free.
  grpc::ServerUnaryReactor* OffThread(grpc::CallbackServerContext* ctx, absl::Status valid,
                                      std::function<absl::Status(absl::Time deadline)> work);

  RolloutWorker* const worker_;
  const ServerAuth* const auth_;
  absl::Mutex mu_;
  absl::Mutex done_mu_;  // guards the bools in threads_
  // LoadWeights/ConfigureWeightSync/Sleep threads and whether each has
  // finished (joined lazily).
  std::list<std::pair<std::thread, std::shared_ptr<bool>>> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rlmesh::rollout
