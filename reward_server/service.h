#pragma once

// RewardService over a RewardScorer: a thin adapter. Score calls run on a
// bounded pool off the gRPC callback threads (verifiers may wait up to their
// deadline); a call that finds the pool full is answered RESOURCE_EXHAUSTED
// at once, so load past the limits costs neither threads nor memory.

#include "absl/status/status.h"
#include "common/auth.h"
#include "common/thread_pool.h"
#include "proto/reward.grpc.pb.h"
#include "reward_server/scorer.h"

namespace rlmesh {

struct RewardServiceOptions {
  // Threads running Score calls; a call holds one while its verifiers and
  // the reward model run. Default 32.
  int score_threads = 32;
  // Score calls that may wait for a thread. A call past score_threads +
  // score_queue is answered RESOURCE_EXHAUSTED at once, naming the limits;
  // the reward clients retry it with backoff. Default 128.
  int score_queue = 128;

  absl::Status Validate() const;
};

// Neither pointer is owned; both must outlive the service, and the gRPC
// server must be shut down before the service goes. Shutdown() (also run by
// the destructor) answers later calls UNAVAILABLE, runs the calls already
// queued (one cancelled meanwhile, by its client or the server's shutdown,
// finishes CANCELLED without being scored) and joins the pool.
//
// Safe for concurrent use: gRPC calls the methods from its own threads, and
// what they share is the scorer (safe for concurrent use) and the pool.
// Shutdown() is safe from any thread except a pool task, and idempotent.
// REQUIRES: options.Validate() is OK.
class RewardServiceImpl final : public RewardService::CallbackService {
 public:
  RewardServiceImpl(const ServerAuth* auth, RewardScorer* scorer, const RewardServiceOptions& options = {});
  ~RewardServiceImpl() override;

  void Shutdown();
  // Score calls accepted and not yet finished, running or queued (at most
  // score_threads + score_queue).
  int score_calls_held() const { return score_pool_.unfinished(); }

  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* ctx, const ScoreRequest* req,
                                  ScoreResponse* resp) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx, const RewardStatusRequest* req,
                                      RewardStatus* resp) override;

 private:
  // Constant after construction.
  const ServerAuth* const auth_;
  RewardScorer* const scorer_;
  const RewardServiceOptions options_;
  // Runs Score calls. Its tasks capture the scorer, never `this`.
  ThreadPool score_pool_;
};

}  // namespace rlmesh
