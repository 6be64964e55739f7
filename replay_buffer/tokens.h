#pragma once

// The opaque tokens the replay store hands out, base64 with a checksum so a
// token from elsewhere (or edited) is refused: Query page tokens (the next
// position, bound to the filter) and FIFO ack tokens (a leased seq range,
// bound to experiment and consumer). Pure functions.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/replay_buffer.pb.h"

namespace rlmesh::replay {

// Query page token: position of the next trajectory + which filter it belongs to.
struct PagePos {
  int64_t step = 0;
  int64_t seq = 0;
  int32_t sample = 0;
};

std::string EncodePageToken(const PagePos& p, const TrajectoryFilter& f);
// INVALID_ARGUMENT when not issued by this code, corrupt, or for another filter.
absl::StatusOr<PagePos> DecodePageToken(const std::string& token, const TrajectoryFilter& f);

// A FIFO lease: seqs [from, to) holding `groups` delivered groups.
struct AckRange {
  int64_t from = 0;
  int64_t to = 0;
  int64_t groups = 0;
};

std::string EncodeAckToken(const std::string& exp, const std::string& consumer, const AckRange& a);
// INVALID_ARGUMENT when not issued for (exp, consumer), corrupt, or an empty range.
absl::StatusOr<AckRange> DecodeAckToken(const std::string& exp, const std::string& consumer,
                                        const std::string& token);

}  // namespace rlmesh::replay
