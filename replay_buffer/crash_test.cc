// Crash safety with real processes: the replay_buffer binary is SIGKILLed at
// random moments (>= 20 times) while writer threads put groups and a FIFO
// consumer (require_ack) samples and acknowledges; it is restarted on the same
// database each time. Afterwards:
//   - every group whose PutGroups was acknowledged is present and whole;
//   - no partial group exists (every stored group has all its samples);
//   - the FIFO consumer received every acknowledged group (at-least-once),
//     and never received a group again after its AckSample was acknowledged.
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/rpc_client.h"
#include "common/subprocess.h"
#include "common/testing/test_util.h"
#include "proto/replay_buffer.grpc.pb.h"

namespace rlmesh {
namespace {

constexpr int kKills = 22;
constexpr int kWriters = 3;

// Samples a group has, derived from its name so a reader can tell a partial
// group from a small one.
int SamplesFor(int i) { return 1 + i % 4; }

TrajectoryGroup MakeGroup(const std::string& gid, int i) {
  TrajectoryGroup g;
  g.set_experiment_id("crash");
  g.set_step(i);
  g.set_group_id(gid);
  g.set_prompt_id(absl::StrCat("p", i % 7));
  for (int j = 0; j < SamplesFor(i); ++j) {
    Trajectory* t = g.add_samples();
    t->set_trajectory_id(absl::StrCat(gid, "/", j));
    t->set_sample_index(j);
    t->set_policy_version(i);
    t->set_reward(j % 2);
    for (int k = 0; k < 64; ++k) {
      t->add_response_token_ids(k);
      t->add_loss_mask(1);
      t->add_behaviour_logprobs(-0.1f);
    }
  }
  return g;
}

class Cluster {
 public:
  explicit Cluster(const testing::TempDir& dir) : dir_(dir) {}

  void Start() {
    std::filesystem::remove(dir_.File("port"));
    auto proc = Subprocess::Start({testing::Runfile("replay_buffer/replay_buffer"), "--port=0",
                                   "--port_file=" + dir_.File("port"),
                                   "--db_path=" + dir_.File("db"),
                                   // A Sample whose reply was lost (client
                                   // deadline) leaves a lease nobody acks;
                                   // it is redelivered after this.
                                   "--ack_timeout_seconds=2"},
                                  dir_.File("server.log"));
    REQUIRE(proc.ok());
    proc_.emplace(*std::move(proc));
    auto port = ReadPortFile(dir_.File("port"), absl::Seconds(20));
    REQUIRE(port.ok());
    auto client = RpcClient::Create(absl::StrCat("127.0.0.1:", *port));
    REQUIRE(client.ok());
    REQUIRE(WaitUntilServing(*client, absl::Seconds(20)).ok());
    std::lock_guard<std::mutex> l(mu_);
    client_ = std::make_shared<RpcClient>(*std::move(client));
  }

  void Kill() {
    proc_->Signal(SIGKILL);
    auto status = proc_->Wait(absl::Seconds(10));
    REQUIRE(status.ok());
  }

  int Stop() { return proc_->Stop(absl::Seconds(5)); }

  std::shared_ptr<RpcClient> client() {
    std::lock_guard<std::mutex> l(mu_);
    return client_;
  }

 private:
  const testing::TempDir& dir_;
  std::optional<Subprocess> proc_;
  std::mutex mu_;
  std::shared_ptr<RpcClient> client_;
};

TEST_CASE("no acknowledged group is lost or torn across repeated SIGKILLs") {
  testing::TempDir dir;
  Cluster cluster(dir);
  cluster.Start();

  std::mutex mu;
  std::map<std::string, int> acked_puts;         // group id -> samples
  std::set<std::string> delivered;               // by the FIFO consumer
  std::set<std::string> acked_deliveries;        // AckSample returned OK for these
  std::vector<std::string> redelivered_after_ack;
  std::vector<std::string> torn_deliveries;
  std::atomic<bool> stop_writers{false};
  std::atomic<bool> stop_consumer{false};
  std::atomic<int> put_errors{0};

  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; !stop_writers; ++i) {
        const std::string gid = absl::StrCat("w", w, "-", i);
        PutGroupsRequest req;
        *req.add_groups() = MakeGroup(gid, i);
        // Retry the same group until acknowledged (a retry of a group that
        // landed before the kill must come back as a duplicate, not twice).
        while (true) {
          auto client = cluster.client();
          auto stub = ReplayBuffer::NewStub(client->channel());
          auto ctx = client->NewContext(absl::Seconds(2));
          PutGroupsResponse resp;
          grpc::Status s = stub->PutGroups(ctx.get(), req, &resp);
          if (s.ok()) {
            REQUIRE(resp.written() + resp.duplicates() == 1);
            std::lock_guard<std::mutex> l(mu);
            acked_puts[gid] = SamplesFor(i);
            break;
          }
          ++put_errors;
          if (stop_writers) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
    });
  }

  std::thread consumer([&] {
    while (!stop_consumer) {
      auto client = cluster.client();
      auto stub = ReplayBuffer::NewStub(client->channel());
      SampleGroupsRequest req;
      req.set_experiment_id("crash");
      req.set_consumer_id("learner");
      req.set_mode(SAMPLE_FIFO);
      // All-or-nothing: once writers stop, the tail may be < 4 groups.
      req.set_num_groups(stop_writers ? 1 : 4);
      req.set_require_ack(true);
      SampleGroupsResponse resp;
      auto ctx = client->NewContext(absl::Milliseconds(500));
      if (!stub->SampleGroups(ctx.get(), req, &resp).ok()) continue;
      {
        std::lock_guard<std::mutex> l(mu);
        for (const auto& g : resp.groups()) {
          const int i = static_cast<int>(g.step());
          if (g.samples_size() != SamplesFor(i)) torn_deliveries.push_back(g.group_id());
          if (acked_deliveries.count(g.group_id())) redelivered_after_ack.push_back(g.group_id());
          delivered.insert(g.group_id());
        }
      }
      AckSampleRequest ack;
      ack.set_experiment_id("crash");
      ack.set_consumer_id("learner");
      ack.set_ack_token(resp.ack_token());
      AckSampleResponse ack_resp;
      auto actx = client->NewContext(absl::Seconds(2));
      if (stub->AckSample(actx.get(), ack, &ack_resp).ok()) {
        std::lock_guard<std::mutex> l(mu);
        for (const auto& g : resp.groups()) acked_deliveries.insert(g.group_id());
      }
    }
  });

  std::mt19937 rng(Catch::rngSeed());
  std::uniform_int_distribution<int> pause_ms(30, 300);
  for (int k = 0; k < kKills; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms(rng)));
    cluster.Kill();
    cluster.Start();
  }
  // Let the writers finish their in-flight groups against the last server.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop_writers = true;
  for (auto& t : writers) t.join();

  // The consumer drains: it must eventually see every acknowledged group.
  const absl::Time drain_deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < drain_deadline) {
    {
      std::lock_guard<std::mutex> l(mu);
      bool all = true;
      for (const auto& [gid, n] : acked_puts) all = all && delivered.count(gid);
      if (all) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop_consumer = true;
  consumer.join();

  INFO("acknowledged puts: " << acked_puts.size() << ", put errors: " << put_errors);
  REQUIRE(acked_puts.size() > 50);
  CHECK(put_errors > 0);  // the kills really interrupted writes

  // Read everything back through Query: whole groups only, all acked present.
  std::map<std::string, int> stored;  // group id -> samples seen
  std::map<std::string, int> group_step;
  auto client = cluster.client();
  auto stub = ReplayBuffer::NewStub(client->channel());
  QueryRequest q;
  q.mutable_filter()->set_experiment_id("crash");
  q.set_limit(1000);
  for (int pages = 0; pages < 10000; ++pages) {
    QueryResponse resp;
    auto ctx = client->NewContext(absl::Seconds(10));
    grpc::Status s = stub->Query(ctx.get(), q, &resp);
    REQUIRE(s.ok());
    for (const auto& t : resp.trajectories()) {
      ++stored[t.group_id()];
      group_step[t.group_id()] = static_cast<int>(t.step());
    }
    if (resp.next_page_token().empty()) break;
    q.set_page_token(resp.next_page_token());
  }
  std::vector<std::string> missing, partial;
  for (const auto& [gid, n] : acked_puts) {
    if (!stored.count(gid)) missing.push_back(gid);
  }
  for (const auto& [gid, n] : stored) {
    if (n != SamplesFor(group_step[gid])) partial.push_back(gid);
  }
  CHECK(missing.empty());
  CHECK(partial.empty());
  CHECK(torn_deliveries.empty());
  std::vector<std::string> undelivered;
  for (const auto& [gid, n] : acked_puts) {
    if (!delivered.count(gid)) undelivered.push_back(gid);
  }
  INFO("undelivered: " << undelivered.size() << " of " << acked_puts.size() << " first: "
                        << (undelivered.empty() ? "" : undelivered[0])
                        << " delivered: " << delivered.size());
  CHECK(undelivered.empty());
  CHECK(redelivered_after_ack.empty());

  const int status = cluster.Stop();
  CHECK(DescribeWaitStatus(status) == "exit 0");
}

}  // namespace
}  // namespace rlmesh
