#pragma once

// ReplayBufferService: the gRPC adapter over ReplayStore. Each method checks
// auth, hands the work to a worker pool (so a synced write or a waiting sample
// never blocks gRPC's own callback threads), converts the result and finishes
// the call exactly once.

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/thread_pool.h"
#include "proto/replay_buffer.grpc.pb.h"
#include "replay_buffer/store.h"

namespace rlmesh {

struct ReplayServiceOptions {
  // Threads running PutGroups, AckSample and Trim. Concurrent synced writes
  // share one WAL fsync (group commit), so more threads = more throughput
  // until the disk saturates. Default 16.
  int writer_threads = 16;
  // Threads running Query, Stats and Export. Default 4.
  int reader_threads = 4;
  // Threads running SampleGroups; a call waiting for data holds one. Calls
  // beyond this queue. Default 16.
  int sampler_threads = 16;
  // Longest a SampleGroups call waits for data when its deadline is further
  // away (or unset). Default 60 s.
  absl::Duration max_sample_wait = absl::Seconds(60);
  // A waiting sample gives up this long before the call's deadline, so the
  // DEADLINE_EXCEEDED answer (and the fact that nothing was consumed) reaches
  // the client instead of racing its own deadline. Default 50 ms.
  absl::Duration deadline_margin = absl::Milliseconds(50);

  absl::Status Validate() const;
};

// The store and auth are not owned and must outlive the service. Shutdown()
// (also run by the destructor) wakes waiting samples, runs what the pools
// have queued and joins them; later calls are answered UNAVAILABLE.
//
// Safe for concurrent use: gRPC calls the methods from its own threads, and
// the state they share is the store (safe for concurrent use) and the three
// pools (ThreadPool is). Shutdown() is safe from any thread and idempotent.
class ReplayBufferService final : public ReplayBuffer::CallbackService {
 public:
  ReplayBufferService(ReplayStore* store, const ServerAuth* auth,
                      const ReplayServiceOptions& options = {});
  ~ReplayBufferService() override;

  void Shutdown();

  grpc::ServerUnaryReactor* PutGroups(grpc::CallbackServerContext* ctx,
                                      const PutGroupsRequest* request,
                                      PutGroupsResponse* response) override;
  grpc::ServerUnaryReactor* SampleGroups(grpc::CallbackServerContext* ctx,
                                         const SampleGroupsRequest* request,
                                         SampleGroupsResponse* response) override;
  grpc::ServerUnaryReactor* AckSample(grpc::CallbackServerContext* ctx,
                                      const AckSampleRequest* request,
                                      AckSampleResponse* response) override;
  grpc::ServerUnaryReactor* Query(grpc::CallbackServerContext* ctx, const QueryRequest* request,
                                  QueryResponse* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const StatsRequest* request,
                                  StatsResponse* response) override;
  grpc::ServerUnaryReactor* Trim(grpc::CallbackServerContext* ctx, const TrimRequest* request,
                                 TrimResponse* response) override;
  grpc::ServerWriteReactor<ExportChunk>* Export(grpc::CallbackServerContext* ctx,
                                                const ExportRequest* request) override;

 private:
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, ThreadPool& pool,
                                std::function<absl::Status()> fn);

  ReplayStore* const store_;
  const ServerAuth* const auth_;
  const ReplayServiceOptions options_;
  ThreadPool writers_;
  ThreadPool readers_;
  ThreadPool samplers_;
};

}  // namespace rlmesh
