#pragma once

// Structure-aware fuzzing of gRPC services, served in this process over
// loopback exactly as a role serves them (common/rpc_server.h: health,
// auth, message limits). A fuzz input is read as choices, not as wire
// bytes: the first byte picks one RPC of the services under test, the rest
// builds a well-formed request for it by protobuf reflection (FillMessage):
// extreme and NaN/inf numbers, unknown enum values, empty and huge repeated
// fields, ids the service knows and ids it does not, odd strings (paths that
// climb out of a root, multi-byte UTF-8, 5,000 characters). The call goes
// through a generic stub, so every RPC of a service is reached without a
// line per method, and a method added later is fuzzed without a change here.
//
// After each call the harness asserts what no input may break, and aborts
// (a libFuzzer crash) with the method and the request when it does:
//   - the call ends (any status) by its deadline plus a grace period;
//   - an OK answer parses as the method's response type;
//   - the server still answers a health check and the target's own check
//     (for example: the seeded experiment is still all there) within a
//     deadline, so no input leaves a lock held or a handler stuck.
// Status codes other than OK are fine (a refused request is the point);
// they are counted per method and printed at exit with the first message
// of each code, which is how a bad-input path that answers INTERNAL or
// UNKNOWN instead of naming the field is found.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/impl/service_type.h"

namespace rlmesh::fuzz {

// Fuzz bytes read front to back; past the end every read is zero, so any
// input (the empty one too) is a valid sequence of choices.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t U32();
  uint64_t U64();
  bool exhausted() const { return pos_ >= size_; }

 private:
  const uint8_t* const data_;
  const size_t size_;
  size_t pos_ = 0;
};

struct FillOptions {
  // Strings a string field may take besides generated ones: the ids, names
  // and addresses the service under test knows, so calls reach real data.
  std::vector<std::string> known_strings;
  // Deepest nesting of sub-messages filled. Default 6.
  int max_depth = 6;
  // Rough upper bound on the bytes of one request; huge repeated fields
  // and long strings stop growing at it. Default 256 KiB.
  size_t max_bytes = 256 << 10;
};

// Sets fields of `msg` (cleared first) as `in` chooses; see the file
// comment for the values. Deterministic in the bytes read.
void FillMessage(ByteReader& in, const FillOptions& options, google::protobuf::Message* msg);

struct RpcFuzzTarget {
  // Served together on one loopback server. Not owned; they outlive the
  // harness (fuzz targets keep them for the life of the process).
  std::vector<grpc::Service*> services;
  // Full names ("rlmesh.ReplayBuffer") of the services whose every method
  // is fuzzed.
  std::vector<std::string> service_names;
  FillOptions fill;
  // Optional: may rewrite a filled request before `allow` sees it (for
  // example, put in the id of an object the service made just now).
  std::function<void(const google::protobuf::MethodDescriptor&, google::protobuf::Message*)> prepare;
  // Optional: false skips a request before it is sent (for example one
  // that would delete the data `check` reads, or run a program).
  std::function<bool(const google::protobuf::MethodDescriptor&, const google::protobuf::Message&)> allow;
  // Optional: run after every call; a non-empty result is what broke.
  // `address` is the server's host:port.
  std::function<std::string(const std::string& address)> check;
  // Deadline of each fuzzed call; an input byte makes some calls use
  // 1 ms instead (cancelled before or while the handler runs). Default
  // 300 ms.
  absl::Duration deadline = absl::Milliseconds(300);
  // How long past its deadline a call may take to end, and the deadline of
  // the health check and `check`. Default 5 s.
  absl::Duration grace = absl::Seconds(5);
};

// One server per process. The first Run() starts it; later ones reuse it.
class RpcFuzzHarness {
 public:
  explicit RpcFuzzHarness(RpcFuzzTarget target);
  ~RpcFuzzHarness();
  RpcFuzzHarness(const RpcFuzzHarness&) = delete;
  RpcFuzzHarness& operator=(const RpcFuzzHarness&) = delete;

  // One fuzz input: one call and the checks. Aborts when a check fails.
  int Run(const uint8_t* data, size_t size);

  const std::string& address() const;

  // Prints the status codes each method answered, with the first message
  // of each code, to stderr. Also run at exit for the live harness.
  void ReportCodes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rlmesh::fuzz
