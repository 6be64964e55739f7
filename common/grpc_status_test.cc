#include "common/grpc_status.h"

#include <string>

#include "catch2/catch.hpp"
#include "common/status_macros.h"

namespace rlmesh {
namespace {

TEST_CASE("every absl code maps to the same gRPC code and back") {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    absl::Status s(code, c == 0 ? "" : "msg");
    grpc::Status g = ToGrpcStatus(s);
    CHECK(static_cast<int>(g.error_code()) == c);
    absl::Status back = FromGrpcStatus(g);
    CHECK(back.code() == code);
    if (c != 0) CHECK(back.message() == "msg");
  }
}

TEST_CASE("messages survive the mapping") {
  auto g = ToGrpcStatus(absl::InvalidArgumentError("field tokens: length 3 != 4"));
  CHECK(g.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(g.error_message() == "field tokens: length 3 != 4");
}

TEST_CASE("long messages are cut to the bound, at a UTF-8 boundary, saying how much was cut") {
  const std::string value(5000, 'z');
  auto g = ToGrpcStatus(absl::InvalidArgumentError("address: " + value));
  CHECK(g.error_message().size() < kMaxStatusMessageBytes + 32);
  CHECK(g.error_message().rfind("address: zzz", 0) == 0);
  CHECK(g.error_message().find("... [3985 more bytes]") != std::string::npos);
  // A two-byte character straddling the bound is not split.
  std::string accents(kMaxStatusMessageBytes - 1, 'a');
  for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";
  const std::string cut = BoundedMessage(accents);
  CHECK(cut.rfind(std::string(kMaxStatusMessageBytes - 1, 'a') + "... [", 0) == 0);
  CHECK(BoundedMessage("short") == "short");
}

absl::Status FailIfNegative(int x) {
  if (x < 0) return absl::InvalidArgumentError("negative");
  return absl::OkStatus();
}

absl::StatusOr<int> Double(int x) {
  RLMESH_RETURN_IF_ERROR(FailIfNegative(x));
  return 2 * x;
}

absl::StatusOr<int> Quadruple(int x) {
  RLMESH_ASSIGN_OR_RETURN(int d, Double(x));
  RLMESH_ASSIGN_OR_RETURN(int q, Double(d));
  return q;
}

TEST_CASE("status macros propagate errors and values") {
  CHECK(*Quadruple(3) == 12);
  auto bad = Quadruple(-1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message() == "negative");
}

}  // namespace
}  // namespace rlmesh
