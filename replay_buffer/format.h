#pragma once

// The replay store's on-disk format (the layout is described in store.h):
// column families, meta-record tags, key builders, the groups-CF summary
// value, id rules (no NUL: keys are NUL-separated) and the mapping of
// RocksDB statuses to absl codes. Pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/replay_buffer.pb.h"
#include "replay_buffer/group_summary.h"

namespace rocksdb {
class Slice;
class Status;
}  // namespace rocksdb

namespace rlmesh::replay {

inline constexpr char kDataCf[] = "data";
inline constexpr char kGroupsCf[] = "groups";
inline constexpr char kPromptCf[] = "by_prompt";
inline constexpr char kMetaCf[] = "meta";
// meta record tags (first byte of the key).
inline constexpr char kExpTag = 'e';
inline constexpr char kGroupTag = 'g';
inline constexpr char kTrajTag = 't';
inline constexpr char kCursorTag = 'c';
inline constexpr char kAckedTag = 'a';

// NOT_FOUND, DATA_LOSS (corruption), UNAVAILABLE (I/O, busy) or INTERNAL,
// the message prefixed with `what`.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what);
absl::string_view Sv(const rocksdb::Slice& s);

std::string ExpPrefix(absl::string_view exp);
std::string DataGroupPrefix(absl::string_view exp, int64_t step, int64_t seq);
std::string DataKey(absl::string_view exp, int64_t step, int64_t seq, int32_t sample);
std::string GroupKey(absl::string_view exp, int64_t seq);
std::string PromptKey(absl::string_view exp, absl::string_view prompt, int64_t step, int64_t seq);
std::string MetaKey(char tag, absl::string_view exp, absl::string_view rest = {});
std::string AckedKey(absl::string_view exp, absl::string_view consumer, int64_t from);
std::string Be64(int64_t v);

// groups CF value: the summary the catalog keeps, plus trajectory ids (read
// only by Trim, to drop the idempotency keys).
std::string EncodeSummary(const GroupSummary& g, const TrajectoryGroup& group);
// False when `v` is malformed. `trajectory_ids` may be null.
bool DecodeSummary(absl::string_view v, GroupSummary* g, std::vector<std::string>* trajectory_ids);

bool HasNul(const std::string& s);
// INVALID_ARGUMENT naming `field` when empty (and `required`) or holding NUL.
absl::Status CheckId(const std::string& value, const std::string& field, bool required);

}  // namespace rlmesh::replay
