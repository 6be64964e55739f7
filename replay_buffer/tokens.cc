#include "replay_buffer/tokens.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "replay_buffer/codec.h"

namespace rlmesh::replay {

namespace {

std::string FilterFingerprintInput(const TrajectoryFilter& f) {
  std::string s;
  f.SerializeToString(&s);  // no map fields: deterministic
  return s;
}

}  // namespace

std::string EncodePageToken(const PagePos& p, const TrajectoryFilter& f) {
  std::string raw = "Q1";
  PutBe64(&raw, p.step);
  PutBe64(&raw, p.seq);
  PutBe32(&raw, p.sample);
  PutBe64(&raw, Fingerprint(FilterFingerprintInput(f)));
  PutBe64(&raw, Fingerprint(raw, 0x51));
  return absl::WebSafeBase64Escape(raw);
}

absl::StatusOr<PagePos> DecodePageToken(const std::string& token, const TrajectoryFilter& f) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw) || raw.size() != 2 + 8 + 8 + 4 + 8 + 8 ||
      raw.compare(0, 2, "Q1") != 0) {
    return absl::InvalidArgumentError("page_token is not a token this server issued");
  }
  Reader r(absl::string_view(raw).substr(2));
  PagePos p;
  // The size was checked above, so every read succeeds; the zeros only keep
  // the compiler from warning.
  uint32_t sample = 0;
  uint64_t filter_fp = 0, check = 0;
  r.I64(&p.step);
  r.I64(&p.seq);
  r.Be32(&sample);
  r.Be64(&filter_fp);
  r.Be64(&check);
  p.sample = static_cast<int32_t>(sample);
  if (check != Fingerprint(absl::string_view(raw).substr(0, raw.size() - 8), 0x51)) {
    return absl::InvalidArgumentError("page_token is corrupt (checksum mismatch)");
  }
  if (filter_fp != Fingerprint(FilterFingerprintInput(f))) {
    return absl::InvalidArgumentError("page_token belongs to a different filter");
  }
  return p;
}

std::string EncodeAckToken(const std::string& exp, const std::string& consumer, const AckRange& a) {
  std::string raw = "A1";
  PutBe64(&raw, a.from);
  PutBe64(&raw, a.to);
  PutBe64(&raw, a.groups);
  PutBe64(&raw, Fingerprint(absl::StrCat(exp, absl::string_view("\0", 1), consumer,
                                         absl::string_view("\0", 1), raw),
                            0xac));
  return absl::WebSafeBase64Escape(raw);
}

absl::StatusOr<AckRange> DecodeAckToken(const std::string& exp, const std::string& consumer,
                                        const std::string& token) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw) || raw.size() != 2 + 8 * 4 ||
      raw.compare(0, 2, "A1") != 0) {
    return absl::InvalidArgumentError("ack_token is not a token this server issued");
  }
  Reader r(absl::string_view(raw).substr(2));
  AckRange a;
  uint64_t check = 0;
  r.I64(&a.from);
  r.I64(&a.to);
  r.I64(&a.groups);
  r.Be64(&check);
  const absl::string_view body = absl::string_view(raw).substr(0, raw.size() - 8);
  if (check != Fingerprint(absl::StrCat(exp, absl::string_view("\0", 1), consumer,
                                        absl::string_view("\0", 1), body),
                           0xac)) {
    return absl::InvalidArgumentError(
        "ack_token does not belong to this experiment_id/consumer_id or is corrupt");
  }
  if (a.from < 0 || a.to <= a.from || a.groups < 0) {
    return absl::InvalidArgumentError("ack_token holds an invalid range");
  }
  return a;
}

}  // namespace rlmesh::replay
