#include "coordinator/run_state.h"

#include <fstream>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

TEST_CASE("runner state round-trips and is NOT_FOUND before the first save") {
  testing::TempDir dir;
  RunStateFiles files(dir.path());
  CHECK(files.LoadState().status().code() == absl::StatusCode::kNotFound);
  REQUIRE(files.SaveState({.rollout_round = 7, .weights_version = 12}).ok());
  auto s = files.LoadState();
  REQUIRE(s.ok());
  CHECK(s->rollout_round == 7);
  CHECK(s->weights_version == 12);
  // The file name and keys are what older runs wrote: a resume reads them.
  std::ifstream in(dir.File("runner_state.json"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "{\"rollout_round\":7,\"weights_version\":12}\n");
}

TEST_CASE("stage markers: absent until written, init_accuracy only when given") {
  testing::TempDir dir;
  RunStateFiles files(dir.path());
  CHECK(files.ReadStageMarker(0).status().code() == absl::StatusCode::kNotFound);
  REQUIRE(files.WriteStageMarker(0, {.checkpoint = "/c/0", .accuracy = 0.5, .init_accuracy = 0.25}).ok());
  REQUIRE(files.WriteStageMarker(1, {.checkpoint = "/c/1", .accuracy = 0.75}).ok());
  CHECK(files.StageMarkerPath(1) == dir.File("stage-1.done.json"));
  auto m0 = files.ReadStageMarker(0);
  auto m1 = files.ReadStageMarker(1);
  REQUIRE(m0.ok());
  REQUIRE(m1.ok());
  CHECK(m0->checkpoint == "/c/0");
  CHECK(m0->accuracy == 0.5);
  REQUIRE(m0->init_accuracy.has_value());
  CHECK(*m0->init_accuracy == 0.25);
  CHECK(m1->checkpoint == "/c/1");
  CHECK_FALSE(m1->init_accuracy.has_value());
  CHECK(files.ReadStageMarker(2).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a damaged marker is DATA_LOSS, not a finished stage") {
  testing::TempDir dir;
  RunStateFiles files(dir.path());
  std::ofstream(dir.File("stage-0.done.json")) << "{\"accuracy\": 0.5}";
  CHECK(files.ReadStageMarker(0).status().code() == absl::StatusCode::kDataLoss);
  std::ofstream(dir.File("init_accuracy.json")) << "not json";
  CHECK(files.ReadInitAccuracy().status().code() == absl::StatusCode::kDataLoss);
  REQUIRE(files.WriteInitAccuracy(0.125).ok());
  CHECK(*files.ReadInitAccuracy() == 0.125);
}

}  // namespace
}  // namespace rlmesh
