#pragma once

// ReplayBufferGroupSource: the trainer's GroupSource over the replay-buffer
// client library (//replay_buffer:client). It only translates a step's
// BufferSource into a SampleGroups / AckSample request: FIFO samples with
// require_ack (acknowledged once the step is applied), uniform and
// prioritized draws without.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_client.h"
#include "learner/trainer.h"
#include "replay_buffer/client.h"

namespace rlmesh::learner {

// Safe for concurrent use (the client is; this adds no state).
class ReplayBufferGroupSource : public GroupSource {
 public:
  // Dials `address` with `options` (auth token, default deadline).
  static absl::StatusOr<std::unique_ptr<ReplayBufferGroupSource>> Create(const std::string& address,
                                                                         const ClientOptions& options = {});
  explicit ReplayBufferGroupSource(std::unique_ptr<ReplayBufferClient> client);

  absl::StatusOr<Sampled> Sample(const BufferSource& source, int num_groups, absl::Duration timeout) override;
  absl::Status Ack(const BufferSource& source, const std::string& ack_token) override;

 private:
  const std::unique_ptr<ReplayBufferClient> client_;
};

}  // namespace rlmesh::learner
