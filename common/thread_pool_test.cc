#include "common/thread_pool.h"

#include <pthread.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"

namespace rlmesh {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(30);

TEST_CASE("every scheduled task runs once before Stop returns") {
  std::atomic<int> ran{0};
  ThreadPool pool(4, "test-pool");
  CHECK(pool.size() == 4);
  for (int i = 0; i < 1000; ++i) REQUIRE(pool.Schedule([&] { ran.fetch_add(1); }));
  pool.Stop();
  CHECK(ran.load() == 1000);
}

TEST_CASE("a one-thread pool runs tasks in the order scheduled") {
  std::vector<int> order;  // touched only by the pool's one thread until Stop
  {
    ThreadPool pool(1, "fifo");
    for (int i = 0; i < 100; ++i) REQUIRE(pool.Schedule([&order, i] { order.push_back(i); }));
  }  // the destructor drains and joins
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[i] == i);
}

TEST_CASE("N threads run N tasks at the same time") {
  constexpr int kThreads = 4;
  absl::Mutex mu;
  int arrived = 0;
  std::atomic<int> all_met{0};
  ThreadPool pool(kThreads, "barrier");
  for (int i = 0; i < kThreads; ++i) {
    REQUIRE(pool.Schedule([&] {
      absl::MutexLock lock(&mu);
      ++arrived;
      // Passes only if every task is running at once.
      if (mu.AwaitWithTimeout(absl::Condition(+[](int* n) { return *n == kThreads; }, &arrived), kDeadline)) {
        all_met.fetch_add(1);
      }
    }));
  }
  pool.Stop();
  CHECK(all_met.load() == kThreads);
}

TEST_CASE("Stop runs what is queued and refuses what comes after") {
  ThreadPool pool(1, "drain");
  absl::Notification gate;
  std::atomic<int> queued_ran{0};
  // Probes scheduled while waiting for Stop to begin: those accepted must
  // run, the refused one must not.
  int probes_accepted = 0;
  std::atomic<int> probes_ran{0};
  REQUIRE(pool.Schedule([&] { gate.WaitForNotificationWithTimeout(kDeadline); }));
  for (int i = 0; i < 5; ++i) REQUIRE(pool.Schedule([&] { queued_ran.fetch_add(1); }));

  std::thread stopper([&] { pool.Stop(); });
  // Stop has begun once Schedule refuses; the first task still holds the
  // only thread, so nothing queued has run yet.
  bool refused = false;
  const absl::Time deadline = absl::Now() + kDeadline;
  while (!refused && absl::Now() < deadline) {
    refused = !pool.Schedule([&] { probes_ran.fetch_add(1); });
    if (!refused) {
      ++probes_accepted;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  REQUIRE(refused);
  CHECK(queued_ran.load() == 0);
  gate.Notify();
  stopper.join();
  CHECK(queued_ran.load() == 5);
  CHECK(probes_ran.load() == probes_accepted);
  CHECK_FALSE(pool.Schedule([&] { probes_ran.fetch_add(1); }));
  CHECK(probes_ran.load() == probes_accepted);
}

TEST_CASE("Stop from several threads at once returns in each after the join") {
  std::atomic<int> ran{0};
  ThreadPool pool(2, "stoppers");
  for (int i = 0; i < 50; ++i) {
    REQUIRE(pool.Schedule([&] {
      absl::SleepFor(absl::Microseconds(200));
      ran.fetch_add(1);
    }));
  }
  std::vector<std::thread> stoppers;
  std::vector<int> seen(3, -1);
  for (int i = 0; i < 3; ++i) {
    stoppers.emplace_back([&, i] {
      pool.Stop();
      seen[i] = ran.load();
    });
  }
  for (auto& t : stoppers) t.join();
  for (int s : seen) CHECK(s == 50);
  pool.Stop();  // idempotent
}

TEST_CASE("a bounded pool holds threads + max_queued tasks and refuses the rest at once") {
  absl::Notification gate;
  std::atomic<int> ran{0};
  ThreadPool pool(2, "bounded", /*max_queued=*/3);
  CHECK(pool.max_queued() == 3);
  auto blocked = [&] {
    gate.WaitForNotificationWithTimeout(kDeadline);
    ran.fetch_add(1);
  };
  // Two running (or about to) and three waiting: the limit holds exactly,
  // whether or not the threads have picked their tasks up yet.
  for (int i = 0; i < 5; ++i) REQUIRE(pool.TrySchedule(blocked).ok());
  CHECK(pool.unfinished() == 5);
  absl::Status full = pool.TrySchedule(blocked);
  CHECK(full.code() == absl::StatusCode::kResourceExhausted);
  CHECK(full.message().find("bounded: all 2 threads busy and 3 tasks queued") != absl::string_view::npos);
  CHECK_FALSE(pool.Schedule(blocked));
  // Finished tasks free their slots.
  gate.Notify();
  const absl::Time deadline = absl::Now() + kDeadline;
  while (pool.unfinished() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  REQUIRE(pool.unfinished() == 0);
  CHECK(ran.load() == 5);
  for (int i = 0; i < 5; ++i) CHECK(pool.TrySchedule([&] { ran.fetch_add(1); }).ok());
  pool.Stop();
  CHECK(ran.load() == 10);
  CHECK(pool.TrySchedule([] {}).code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("max_queued 0 runs one task per thread and queues none") {
  absl::Notification gate;
  ThreadPool pool(1, "no-queue", /*max_queued=*/0);
  REQUIRE(pool.TrySchedule([&] { gate.WaitForNotificationWithTimeout(kDeadline); }).ok());
  CHECK(pool.TrySchedule([] {}).code() == absl::StatusCode::kResourceExhausted);
  gate.Notify();
}

TEST_CASE("pool threads carry the pool's name, cut to 15 characters") {
  std::string name;
  {
    ThreadPool pool(1, "a-very-long-pool-name");
    REQUIRE(pool.Schedule([&] {
      char buf[32] = {};
      pthread_getname_np(pthread_self(), buf, sizeof(buf));
      name = buf;
    }));
  }
  CHECK(name == "a-very-long-poo");
}

}  // namespace
}  // namespace rlmesh
