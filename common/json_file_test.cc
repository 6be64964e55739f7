#include "common/json_file.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

bool Says(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

TEST_CASE("ReadJsonObjectFile returns the object in the file") {
  testing::TempDir dir;
  std::ofstream(dir.File("a.json")) << R"({"eos_token_id": [1, 2], "name": "x"})";
  auto j = ReadJsonObjectFile(dir.File("a.json"));
  REQUIRE(j.ok());
  CHECK((*j)["eos_token_id"] == nlohmann::json({1, 2}));
  CHECK((*j)["name"] == "x");
  CHECK(j->size() == 2);
}

TEST_CASE("ReadJsonObjectFile: NOT_FOUND for an absent file") {
  testing::TempDir dir;
  auto j = ReadJsonObjectFile(dir.File("absent.json"));
  CHECK(j.status().code() == absl::StatusCode::kNotFound);
  CHECK(Says(j.status(), dir.File("absent.json")));
}

TEST_CASE("ReadJsonObjectFile: INVALID_ARGUMENT naming the file for anything but one JSON object") {
  testing::TempDir dir;
  auto refused = [&](const std::string& text) {
    std::ofstream(dir.File("bad.json"), std::ios::trunc) << text;
    return ReadJsonObjectFile(dir.File("bad.json")).status();
  };
  const std::string prefix = dir.File("bad.json") + ": not a JSON object";
  absl::Status s = refused("{not json");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Says(s, prefix));
  CHECK(Says(s, prefix + " (parse error at line 1, column 3: syntax error"));
  s = refused("[1, 2]");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Says(s, prefix + " (array)"));
  s = refused("");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Says(s, prefix));
  s = refused(R"({"a": 1} {"b": 2})");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Says(s, prefix));
  // A folder where the file should be exists, so it is refused, not absent.
  std::filesystem::create_directory(dir.File("dir.json"));
  s = ReadJsonObjectFile(dir.File("dir.json")).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Says(s, dir.File("dir.json")));
}

}  // namespace
}  // namespace rlmesh
