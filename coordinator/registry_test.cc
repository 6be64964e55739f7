#include "coordinator/registry.h"

#include <string>
#include <thread>

#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

RoleInfo Info(const std::string& name, Role role = ROLE_ROLLOUT_WORKER, const std::string& address = "10.0.0.2:4000") {
  RoleInfo i;
  i.set_name(name);
  i.set_role(role);
  i.set_address(address);
  i.set_host("node1");
  i.add_capabilities("gloo");
  return i;
}

struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1'000'000);
  std::function<absl::Time()> fn() {
    return [this] { return now; };
  }
};

RegistryOptions Options(FakeClock* clock) {
  RegistryOptions o;
  o.heartbeat_interval = absl::Seconds(1);
  o.heartbeat_timeout = absl::Seconds(3);
  o.clock = clock->fn();
  return o;
}

TEST_CASE("a role without heartbeats for the timeout is DEAD, and a heartbeat revives it") {
  FakeClock clock;
  Registry r(Options(&clock));
  REQUIRE(r.Register(Info("rollout-0")).ok());
  REQUIRE(r.Roles().size() == 1);
  CHECK(r.Roles()[0].health() == "SERVING");
  CHECK(r.Roles()[0].host() == "node1");
  clock.now += absl::Seconds(2);
  CHECK(r.Heartbeat("rollout-0"));
  clock.now += absl::Seconds(3);  // exactly the timeout since the last beat
  CHECK(r.Roles()[0].health() == "SERVING");
  clock.now += absl::Milliseconds(1);
  CHECK(r.Roles()[0].health() == "DEAD");
  CHECK(r.Roles()[0].last_heartbeat_unix_micros() == absl::ToUnixMicros(absl::FromUnixSeconds(1'000'002)));
  CHECK(r.Heartbeat("rollout-0"));
  CHECK(r.Roles()[0].health() == "SERVING");
}

TEST_CASE("heartbeat of an unknown role says so; registering again counts a restart") {
  FakeClock clock;
  Registry r(Options(&clock));
  CHECK_FALSE(r.Heartbeat("learner-0"));
  REQUIRE(r.Register(Info("learner-0", ROLE_LEARNER)).ok());
  CHECK(r.Registrations("learner-0") == 1);
  REQUIRE(r.Register(Info("learner-0", ROLE_LEARNER, "10.0.0.3:4001")).ok());
  CHECK(r.Registrations("learner-0") == 2);
  auto roles = r.Roles();
  REQUIRE(roles.size() == 1);
  CHECK(roles[0].restarts() == 1);
  CHECK(roles[0].address() == "10.0.0.3:4001");
  // The same name under another role is refused.
  CHECK(r.Register(Info("learner-0", ROLE_REPLAY_BUFFER)).code() == absl::StatusCode::kAlreadyExists);
}

TEST_CASE("Register refuses bad input and names the field") {
  FakeClock clock;
  Registry r(Options(&clock));
  auto refused = [&](const RoleInfo& info, const std::string& field) {
    absl::Status s = r.Register(info);
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(field) != absl::string_view::npos);
  };
  refused(Info("../../etc/passwd"), "role.name");
  refused(Info(std::string(5000, 'a')), "role.name");
  refused(Info(""), "role.name");
  refused(Info("-x"), "role.name");
  refused(Info("a..b"), "role.name");
  refused(Info("a/b"), "role.name");
  refused(Info("ok", ROLE_UNSPECIFIED), "role.role");
  refused(Info("ok", ROLE_COORDINATOR), "role.role");
  refused(Info("ok", static_cast<Role>(99)), "role.role");
  refused(Info("ok", ROLE_LEARNER, ""), "role.address");
  refused(Info("ok", ROLE_LEARNER, "host"), "role.address");
  refused(Info("ok", ROLE_LEARNER, "host:0"), "role.address");
  refused(Info("ok", ROLE_LEARNER, "host:70000"), "role.address");
  refused(Info("ok", ROLE_LEARNER, "host:12a"), "role.address");
  refused(Info("ok", ROLE_LEARNER, "0.0.0.0:4000"), "role.address");
  refused(Info("ok", ROLE_LEARNER, "ho st:4000"), "role.address");
  refused(Info("ok", ROLE_LEARNER, std::string(300, 'h') + ":4000"), "role.address");
  RoleInfo bad_host = Info("ok");
  bad_host.set_host("a;rm -rf");
  refused(bad_host, "role.host");
  RoleInfo bad_cap = Info("ok");
  bad_cap.add_capabilities(std::string(65, 'c'));
  refused(bad_cap, "role.capabilities");
  CHECK(r.Roles().empty());
  CHECK(r.Register(Info("rollout-1.b_c", ROLE_ROLLOUT_WORKER, "[::1]:4000")).ok());
}

TEST_CASE("WaitFor returns once the role registers again, and times out otherwise") {
  Registry r;
  REQUIRE(r.Register(Info("reward-0", ROLE_REWARD_SERVER)).ok());
  CHECK(r.WaitFor("reward-0", 1, absl::Milliseconds(50)).status().code() == absl::StatusCode::kDeadlineExceeded);
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(50));
    (void)r.Register(Info("reward-0", ROLE_REWARD_SERVER, "10.0.0.9:5000"));
  });
  auto got = r.WaitFor("reward-0", 1, absl::Seconds(10));
  later.join();
  REQUIRE(got.ok());
  CHECK(got->address() == "10.0.0.9:5000");
}

TEST_CASE("registry options are validated") {
  RegistryOptions o;
  CHECK(o.Validate().ok());
  o.heartbeat_timeout = o.heartbeat_interval;
  CHECK(o.Validate().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rlmesh
