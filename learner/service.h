#pragma once

// LearnerService: the gRPC adapter over one Trainer. Configure, TrainStep,
// Save, Load and PublishWeights run one at a time, in arrival order, on the
// service's own worker thread (a TrainStep can take minutes; gRPC's callback
// threads are never blocked); GetStatus answers inline from the trainer's
// snapshot, HostStore inline under its own lock. Every call checks
// auth first and is finished exactly once.
//
// The replay buffer is reached through ReplayBufferGroupSource (over the
// //replay_buffer:client library) created from ConfigureRequest.replay_buffer_address, or through a
// GroupSource injected for tests.

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/rpc_client.h"
#include "common/thread_pool.h"
#include "learner/replay_group_source.h"
#include "learner/trainer.h"
#include "proto/learner.grpc.pb.h"

namespace rlmesh::weight_sync {
class WeightPublisher;
class WeightSyncStore;
}

namespace rlmesh::learner {

// The trainer and auth are not owned and must outlive the service.
// Shutdown() (also run by the destructor) finishes queued calls and joins
// the worker; later calls are answered UNAVAILABLE.
//
// Safe for concurrent use: gRPC calls the methods from its own threads; the
// trainer (except its concurrent-safe Status()), the replay-buffer source
// and the publisher are touched only on the worker thread, the weight-sync
// store under store_mu_. Shutdown() is
// safe from any thread and idempotent (not from the worker thread itself).
class LearnerService final : public Learner::CallbackService {
 public:
  // `client_options` are used for the replay buffer client (auth token).
  LearnerService(Trainer* trainer, const ServerAuth* auth, ClientOptions client_options = {});
  ~LearnerService() override;

  // Tests: use this source instead of dialling replay_buffer_address.
  void set_group_source_for_test(GroupSource* source);
  void Shutdown();

  grpc::ServerUnaryReactor* Configure(grpc::CallbackServerContext* ctx, const ConfigureRequest* req,
                                      ConfigureResponse* resp) override;
  grpc::ServerUnaryReactor* TrainStep(grpc::CallbackServerContext* ctx, const TrainStepRequest* req,
                                      TrainStepResponse* resp) override;
  grpc::ServerUnaryReactor* Save(grpc::CallbackServerContext* ctx, const SaveRequest* req,
                                 SaveResponse* resp) override;
  grpc::ServerUnaryReactor* Load(grpc::CallbackServerContext* ctx, const LoadRequest* req,
                                 LoadResponse* resp) override;
  grpc::ServerUnaryReactor* PublishWeights(grpc::CallbackServerContext* ctx,
                                           const PublishWeightsRequest* req,
                                           PublishWeightsResponse* resp) override;
  grpc::ServerUnaryReactor* HostStore(grpc::CallbackServerContext* ctx, const HostStoreRequest* req,
                                      HostStoreResponse* resp) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx, const LearnerStatusRequest* req,
                                      LearnerStatus* resp) override;

 private:
  // Checks auth, then queues `work` for the worker; finishes exactly once.
  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* ctx, std::function<absl::Status()> work);

  Trainer* const trainer_;
  const ServerAuth* const auth_;
  const ClientOptions client_options_;

  // Used only on the worker thread.
  std::unique_ptr<ReplayBufferGroupSource> source_;
  GroupSource* test_source_ = nullptr;
  // One publisher per weight piece (key -1: the whole model), each with the
  // serialized spec it was made for; a new spec replaces it.
  struct Publisher {
    std::string spec;
    std::unique_ptr<weight_sync::WeightPublisher> publisher;
  };
  std::map<int, Publisher> publishers_;

  // The c10d store this process hosts (HostStore) for the learner group and
  // the weight-sync groups, for the life of the process.
  absl::Mutex store_mu_;
  std::unique_ptr<weight_sync::WeightSyncStore> store_ ABSL_GUARDED_BY(store_mu_);

  // One thread: calls run one at a time, in arrival order. Declared last so
  // that its tasks never outlive the members above.
  ThreadPool worker_;
};

}  // namespace rlmesh::learner
