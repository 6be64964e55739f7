#pragma once

// RewardService over a RewardScorer: a thin adapter. Scoring runs off the
// gRPC callback thread (verifiers may wait up to their deadline).

#include "common/auth.h"
#include "proto/reward.grpc.pb.h"
#include "reward_server/scorer.h"

namespace rlmesh {

// Safe for concurrent use. Neither pointer is owned.
class RewardServiceImpl final : public RewardService::CallbackService {
 public:
  RewardServiceImpl(const ServerAuth* auth, RewardScorer* scorer) : auth_(auth), scorer_(scorer) {}
  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* ctx, const ScoreRequest* req,
                                  ScoreResponse* resp) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx, const RewardStatusRequest* req,
                                      RewardStatus* resp) override;

 private:
  const ServerAuth* const auth_;
  RewardScorer* const scorer_;
};

}  // namespace rlmesh
