#include "common/trace.h"

#include <fstream>
#include <thread>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "nlohmann/json.hpp"

namespace rlmesh {
namespace {

nlohmann::json Load(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// One process, one recorder: the cases run in order in this binary.
TEST_CASE("spans from several threads land in one trace file; files merge onto one axis") {
  testing::TempDir dir;
  CHECK_FALSE(TracingEnabled());
  { TraceSpan off("not recorded", "test"); }
  CHECK(FlushTrace().ok());  // off: nothing to write, not an error

  EnableTracing(dir.File("a.json"), "worker \"one\"", /*max_events=*/5);
  REQUIRE(TracingEnabled());
  const int64_t before = absl::ToUnixMicros(absl::Now());
  {
    TraceSpan outer("step", "runner");
    std::thread t([] { TraceSpan inner("generate", "rollout"); absl::SleepFor(absl::Milliseconds(5)); });
    t.join();
  }
  RecordSpan("score", "reward", before, 7, "{\"items\":3}");
  for (int i = 0; i < 5; ++i) RecordSpan("extra", "test", before, 1);  // 2 fit, 3 dropped
  REQUIRE(FlushTrace().ok());
  nlohmann::json a = Load(dir.File("a.json"));
  const auto& ev = a["traceEvents"];
  REQUIRE(ev.size() == 1 + 5);  // process name + the cap
  CHECK(ev[0]["ph"] == "M");
  CHECK(ev[0]["args"]["name"] == "worker \"one\"");
  CHECK(a["otherData"]["dropped_events"] == 3);
  // The inner span ends first; the outer one contains it.
  CHECK(ev[1]["name"] == "generate");
  CHECK(ev[2]["name"] == "step");
  CHECK(ev[1]["tid"] != ev[2]["tid"]);
  CHECK(ev[1]["dur"].get<int64_t>() >= 5000);
  CHECK(ev[2]["ts"].get<int64_t>() <= ev[1]["ts"].get<int64_t>());
  CHECK(ev[2]["ts"].get<int64_t>() + ev[2]["dur"].get<int64_t>() >=
        ev[1]["ts"].get<int64_t>() + ev[1]["dur"].get<int64_t>());
  CHECK(ev[2]["ts"].get<int64_t>() >= before);
  CHECK(ev[3]["args"]["items"] == 3);

  // A second process's file, written by hand, merges with this one.
  {
    std::ofstream b(dir.File("b.json"));
    b << R"({"traceEvents":[{"name":"process_name","ph":"M","pid":99,"tid":0,"args":{"name":"learner"}},)"
      << R"({"name":"train","cat":"learner","ph":"X","ts":1,"dur":2,"pid":99,"tid":1}]})";
  }
  auto n = MergeTraces({dir.File("a.json"), dir.File("b.json")}, dir.File("all.json"));
  REQUIRE(n.ok());
  CHECK(*n == 5 + 1);
  nlohmann::json all = Load(dir.File("all.json"));
  CHECK(all["traceEvents"].size() == 6 + 2);
  CHECK(all["traceEvents"].back()["pid"] == 99);

  {
    std::ofstream bad(dir.File("bad.json"));
    bad << "{\"events\": []}";
  }
  auto refused = MergeTraces({dir.File("a.json"), dir.File("bad.json")}, dir.File("x.json"));
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.status().message()).find("bad.json") != std::string::npos);
  CHECK(MergeTraces({dir.File("absent.json")}, dir.File("x.json")).status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rlmesh
