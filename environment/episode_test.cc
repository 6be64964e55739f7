#include "environment/episode.h"

#include <cstdio>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/testing/test_util.h"
#include "environment/episode_table.h"

namespace rlmesh::environment {
namespace {

EnvironmentOptions Options(const std::string& evaluator = "environment/calc_eval") {
  EnvironmentOptions o;
  o.evaluator_path = testing::Runfile(evaluator);
  return o;
}

StepRequest Action(const std::string& text) {
  StepRequest s;
  s.set_action_text(text);
  return s;
}

TEST_CASE("the calculator evaluates the turn's tool call") {
  EnvironmentOptions o = Options();
  EnvironmentTask task;
  task.set_reference_answer("408");
  auto ep = MakeEpisode(task, o);
  REQUIRE(ep.ok());
  CHECK((*ep)->FirstObservation().empty());
  auto r = (*ep)->Step(Action("I compute <calc>12*34</calc>"));
  REQUIRE(r.ok());
  CHECK(r->observation() == "<result>408</result>");
  CHECK_FALSE(r->done());
  CHECK(r->reward() == 0);
  CHECK(r->info().at("expression") == "12*34");
  // A bad expression is an observation the model sees.
  auto bad = (*ep)->Step(Action("<calc>7/(3-3)</calc>"));
  REQUIRE(bad.ok());
  CHECK(bad->observation().rfind("<error>division by zero", 0) == 0);
  CHECK_FALSE(bad->done());
  // No tool call: the final answer, judged against the reference.
  auto fin = (*ep)->Step(Action(" so the answer is 408"));
  REQUIRE(fin.ok());
  CHECK(fin->done());
  CHECK(fin->reward() == 1.0);
  auto ep2 = MakeEpisode(task, o);
  auto wrong = (*ep2)->Step(Action("answer: 407"));
  CHECK(wrong->done());
  CHECK(wrong->reward() == 0.0);
}

TEST_CASE("a runaway evaluation is an error observation, not a crash") {
  // The hog stands in for an evaluator an expression drove into a loop.
  EnvironmentOptions o = Options("environment/sandbox_hog");
  o.sandbox.cpu_seconds = 1;
  // Generous: on a loaded machine a CPU second takes longer than that.
  o.sandbox.wall_timeout = absl::Seconds(30);
  auto ep = MakeEpisode(EnvironmentTask{}, o);
  REQUIRE(ep.ok());
  auto r = (*ep)->Step(Action("<calc>spin</calc>"));
  REQUIRE(r.ok());
  INFO(r->observation());
  CHECK(r->observation().rfind("<error>killed: CPU time limit", 0) == 0);
  CHECK(r->info().at("error").find("CPU time limit") != std::string::npos);
  CHECK_FALSE(r->done());
  o.sandbox.address_space_bytes = int64_t{64} << 20;
  auto mem = (*ep)->Step(Action("<calc>alloc</calc>"));
  REQUIRE(mem.ok());
  CHECK(mem->observation() == "<error>exit 3</error>");
}

TEST_CASE("the arithmetic environment asks, judges and ends") {
  EnvironmentOptions o = Options();
  EnvironmentTask task;
  task.set_environment("arithmetic");
  (*task.mutable_metadata())["steps"] = "2";
  (*task.mutable_metadata())["digits"] = "1";
  task.set_seed(7);
  auto ep = MakeEpisode(task, o);
  REQUIRE(ep.ok());
  const std::string q1 = (*ep)->FirstObservation();
  int a = 0, b = 0;
  REQUIRE(std::sscanf(q1.c_str(), "Q1: %d+%d=", &a, &b) == 2);
  auto r1 = (*ep)->Step(Action(std::to_string(a + b)));
  REQUIRE(r1.ok());
  CHECK(r1->reward() == 0.5);
  CHECK_FALSE(r1->done());
  CHECK(r1->observation().rfind(" correct\nQ2: ", 0) == 0);
  int c = 0, d = 0;
  REQUIRE(std::sscanf(r1->observation().c_str(), " correct\nQ2: %d+%d=", &c, &d) == 2);
  auto r2 = (*ep)->Step(Action(std::to_string(c + d + 1)));
  CHECK(r2->reward() == 0.0);
  CHECK(r2->done());
  CHECK(r2->observation() == " wrong (" + std::to_string(c + d) + ")");
  // Same task, same questions.
  auto again = MakeEpisode(task, o);
  CHECK((*again)->FirstObservation() == q1);
  (*task.mutable_metadata())["steps"] = "99";
  CHECK(MakeEpisode(task, o).status().message().find("task.metadata[\"steps\"]") != std::string::npos);
  task.set_environment("chess");
  CHECK(MakeEpisode(task, o).status().message().find("unknown environment \"chess\"") != std::string::npos);
}

TEST_CASE("the episode table tracks, steps, closes and expires episodes") {
  EpisodeTableOptions t;
  t.max_episodes = 2;
  t.idle_timeout = absl::Milliseconds(200);
  EpisodeTable table(Options(), t);
  auto a = table.Reset(ResetRequest{});
  auto b = table.Reset(ResetRequest{});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->episode_id() != b->episode_id());
  CHECK(table.Reset(ResetRequest{}).status().code() == absl::StatusCode::kResourceExhausted);
  StepRequest s = Action("<calc>1+1</calc>");
  s.set_episode_id(a->episode_id());
  CHECK(table.Step(s)->observation() == "<result>2</result>");
  table.Close(a->episode_id());
  table.Close(a->episode_id());  // idempotent
  CHECK(table.Step(s).status().code() == absl::StatusCode::kNotFound);
  CHECK(table.size() == 1);
  absl::SleepFor(absl::Milliseconds(300));
  REQUIRE(table.Reset(ResetRequest{}).ok());  // expires b on the way
  CHECK(table.size() == 1);
}

TEST_CASE("LastNumber finds the final number") {
  double v = 0;
  CHECK(LastNumber("the answer is 408.", &v));
  CHECK(v == 408);
  CHECK(LastNumber("x = -12", &v));
  CHECK(v == -12);
  CHECK(LastNumber("3.5 apples", &v));
  CHECK(v == 3.5);
  CHECK_FALSE(LastNumber("none", &v));
}

}  // namespace
}  // namespace rlmesh::environment
