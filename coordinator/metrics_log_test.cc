#include "coordinator/metrics_log.h"

#include <fstream>

#include "catch2/catch.hpp"
#include "common/testing/test_util.h"

namespace rlmesh {
namespace {

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

TEST_CASE("metrics pages hold complete lines from the asked record on") {
  testing::TempDir dir;
  const std::string path = dir.File("metrics.jsonl");
  Write(path, "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"step\":4}\n");
  auto first = ReadMetricsPage(path, 0, 3);
  REQUIRE(first.ok());
  REQUIRE(first->records.size() == 3);
  CHECK(first->records[0] == "{\"step\":1}");
  CHECK(first->records[2] == "{\"step\":3}");
  CHECK(first->next == 3);
  auto second = ReadMetricsPage(path, first->next, 3);
  REQUIRE(second.ok());
  REQUIRE(second->records.size() == 1);
  CHECK(second->records[0] == "{\"step\":4}");
  CHECK(second->next == 4);
  auto past = ReadMetricsPage(path, 10, 3);
  REQUIRE(past.ok());
  CHECK(past->records.empty());
  CHECK(past->next == 10);
}

TEST_CASE("a line still being written is left for the next page") {
  testing::TempDir dir;
  const std::string path = dir.File("metrics.jsonl");
  Write(path, "{\"step\":1}\n{\"ste");
  auto page = ReadMetricsPage(path, 0, 100);
  REQUIRE(page.ok());
  REQUIRE(page->records.size() == 1);
  CHECK(page->next == 1);
  Write(path, "{\"step\":1}\n{\"step\":2}\n");
  auto later = ReadMetricsPage(path, page->next, 100);
  REQUIRE(later.ok());
  REQUIRE(later->records.size() == 1);
  CHECK(later->records[0] == "{\"step\":2}");
}

TEST_CASE("a run that wrote nothing yet has an empty page; bad ranges are refused") {
  testing::TempDir dir;
  auto none = ReadMetricsPage(dir.File("absent.jsonl"), 0, 10);
  REQUIRE(none.ok());
  CHECK(none->records.empty());
  CHECK(none->next == 0);
  auto negative = ReadMetricsPage(dir.File("absent.jsonl"), -1, 10);
  CHECK(negative.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(negative.status().message()).find("from_record") != std::string::npos);
  CHECK(ReadMetricsPage(dir.File("absent.jsonl"), 0, 0).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("an experiment's page comes from its run directory; a queued one has none yet") {
  testing::TempDir dir;
  Write(dir.File("metrics.jsonl"), "{\"step\":1}\n");
  ExperimentStatus running;
  running.set_run_dir(dir.path());
  auto page = ReadExperimentMetrics(running, 0, 10);
  REQUIRE(page.ok());
  REQUIRE(page->records.size() == 1);
  CHECK(page->next == 1);
  ExperimentStatus queued;
  auto none = ReadExperimentMetrics(queued, 4, 10);
  REQUIRE(none.ok());
  CHECK(none->records.empty());
  CHECK(none->next == 4);
  CHECK(ReadExperimentMetrics(queued, -1, 10).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlmesh
