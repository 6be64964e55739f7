// The dashboard's HTTP API over a fake source: auth, every route's JSON,
// the samples filter, errors named — no cluster, no browser (the browser
// test, tests/dashboard_browser_test.sh, drives the page itself).
#include "coordinator/dashboard.h"

#include <httplib.h>

#include <string>

#include "absl/synchronization/mutex.h"
#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

class FakeSource final : public DashboardSource {
 public:
  std::vector<ExperimentStatus> Experiments() override {
    ExperimentStatus e;
    e.set_experiment_id("exp-1");
    e.set_state("RUNNING");
    e.set_stage("grpo");
    e.set_step(3);
    (*e.mutable_metrics())["reward_mean"] = 0.5;
    return {e};
  }
  std::vector<RoleInfo> Roles() override {
    RoleInfo r;
    r.set_name("learner-0");
    r.set_role(ROLE_LEARNER);
    r.set_health("SERVING");
    r.set_restarts(2);
    return {r};
  }
  absl::StatusOr<MetricsPage> Metrics(const std::string& id, int64_t from, int) override {
    if (id != "exp-1") return absl::NotFoundError("experiment: unknown");
    MetricsPage p;
    for (int64_t i = from; i < 3; ++i) p.records.push_back("{\"event\":\"step\",\"step\":" + std::to_string(i + 1) + "}");
    p.next = std::max<int64_t>(from, 3);
    return p;
  }
  absl::StatusOr<QueryResponse> Samples(const QueryRequest& q) override {
    absl::MutexLock lock(&mu_);
    last_query_ = q;
    QueryResponse resp;
    Trajectory* t = resp.add_trajectories();
    t->set_trajectory_id("exp-1/0/p/0");
    t->set_step(2);
    t->set_reward(1.0);
    (*t->mutable_reward_components())["numeric_answer"] = 1.0;
    t->add_prompt_token_ids(5);
    t->add_prompt_token_ids(6);
    t->add_response_token_ids(7);
    t->add_response_token_ids(8);
    t->add_behaviour_logprobs(-0.25f);
    t->add_behaviour_logprobs(-2.0f);
    t->set_response_text("\"4\n");
    return resp;
  }
  std::vector<std::string> TokenTexts(const std::vector<int>& ids) override {
    std::vector<std::string> out;
    for (int id : ids) out.push_back(id == 7 ? "\"4" : "\n");
    return out;
  }
  std::string Decode(const std::vector<int>& ids) override { return "2+2=" + std::to_string(ids.size()); }

  QueryRequest last_query() {
    absl::MutexLock lock(&mu_);
    return last_query_;
  }

 private:
  absl::Mutex mu_;
  QueryRequest last_query_;
};

TEST_CASE("the dashboard serves its page and JSON, and refuses requests without the token") {
  FakeSource source;
  DashboardOptions o;
  o.auth_token = "s3cret";
  auto server = DashboardServer::Start(o, &source);
  REQUIRE(server.ok());
  httplib::Client http("127.0.0.1", (*server)->port());

  SECTION("no token, a wrong one: 401 on every route") {
    for (const char* path : {"/", "/api/experiments", "/api/roles", "/api/metrics?experiment=exp-1",
                             "/api/samples?experiment=exp-1", "/?token=wrong"}) {
      auto res = http.Get(path);
      REQUIRE(res);
      CHECK(res->status == 401);
    }
    httplib::Headers wrong = {{"Authorization", "Bearer s3cres"}};
    CHECK(http.Get("/api/roles", wrong)->status == 401);
  }

  SECTION("opening /?token= sets the cookie the page's requests then carry") {
    auto res = http.Get("/?token=s3cret");
    REQUIRE(res);
    CHECK(res->status == 200);
    CHECK(res->get_header_value("Set-Cookie").find("rlmesh_token=s3cret") != std::string::npos);
    CHECK(res->get_header_value("Set-Cookie").find("HttpOnly") != std::string::npos);
    CHECK(res->body.find("<svg") == std::string::npos);  // plots are drawn by the page's script
    CHECK(res->body.find("/api/metrics") != std::string::npos);
    httplib::Headers cookie = {{"Cookie", "other=1; rlmesh_token=s3cret"}};
    CHECK(http.Get("/api/roles", cookie)->status == 200);
  }

  SECTION("routes") {
    httplib::Headers auth = {{"Authorization", "Bearer s3cret"}};
    auto exps = http.Get("/api/experiments", auth);
    REQUIRE(exps);
    CHECK(exps->status == 200);
    CHECK(exps->body.find("\"experiment_id\":\"exp-1\"") != std::string::npos);
    CHECK(exps->body.find("\"reward_mean\":0.5") != std::string::npos);

    auto roles = http.Get("/api/roles", auth);
    CHECK(roles->body.find("\"name\":\"learner-0\"") != std::string::npos);
    CHECK(roles->body.find("\"restarts\":2") != std::string::npos);

    auto metrics = http.Get("/api/metrics?experiment=exp-1&from=1", auth);
    CHECK(metrics->status == 200);
    CHECK(metrics->body == "{\"records\":[{\"event\":\"step\",\"step\":2},{\"event\":\"step\",\"step\":3}],\"next\":3}");
    CHECK(http.Get("/api/metrics?experiment=nope", auth)->status == 404);
    auto bad_from = http.Get("/api/metrics?experiment=exp-1&from=x", auth);
    CHECK(bad_from->status == 400);
    CHECK(bad_from->body.find("from") != std::string::npos);

    auto samples = http.Get("/api/samples?experiment=exp-1&min_step=2&min_reward=0.5&text=4&limit=7", auth);
    REQUIRE(samples);
    CHECK(samples->status == 200);
    const QueryRequest q = source.last_query();
    CHECK(q.filter().experiment_id() == "exp-1");
    CHECK(q.filter().min_step() == 2);
    CHECK(q.filter().has_reward_range());
    CHECK(q.filter().min_reward() == 0.5);
    CHECK(q.filter().text_contains() == "4");
    CHECK(q.limit() == 7);
    // Text is escaped; each response token carries its text and log-prob.
    CHECK(samples->body.find("\"response_text\":\"\\\"4\\n\"") != std::string::npos);
    CHECK(samples->body.find("\"prompt_text\":\"2+2=2\"") != std::string::npos);
    CHECK(samples->body.find("{\"text\":\"\\\"4\",\"logprob\":-0.25,\"trained\":true}") != std::string::npos);
    CHECK(samples->body.find("\"numeric_answer\":1") != std::string::npos);
  }
}

TEST_CASE("the samples filter names what is wrong") {
  auto missing = SamplesQuery({{"min_step", "1"}});
  CHECK(missing.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(missing.status().message()).find("experiment") != std::string::npos);
  auto bad = SamplesQuery({{"experiment", "e"}, {"min_reward", "lots"}});
  CHECK(std::string(bad.status().message()).find("min_reward") != std::string::npos);
  auto negative = SamplesQuery({{"experiment", "e"}, {"max_step", "-3"}});
  CHECK(std::string(negative.status().message()).find("max_step") != std::string::npos);
  auto big = SamplesQuery({{"experiment", "e"}, {"limit", "100000"}});
  CHECK(std::string(big.status().message()).find("limit") != std::string::npos);
  auto unknown = SamplesQuery({{"experiment", "e"}, {"rewrd", "1"}});
  CHECK(std::string(unknown.status().message()).find("rewrd") != std::string::npos);
  auto open_top = SamplesQuery({{"experiment", "e"}, {"min_reward", "1"}, {"max_step", ""}});
  REQUIRE(open_top.ok());
  CHECK(open_top->filter().max_reward() > 1e100);
  CHECK(open_top->filter().max_step() == 0);
}

}  // namespace
}  // namespace rlmesh
