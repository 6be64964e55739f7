#pragma once

// ThreadPool: a fixed set of threads draining one FIFO of tasks, optionally
// with a limit on the work it holds.
//
//   ThreadPool pool(4, "rb-write");
//   if (!pool.Schedule([&] { Work(); })) { /* stopping: not run */ }
//   pool.Stop();  // runs what is queued, then joins
//
//   ThreadPool bounded(4, "score", /*max_queued=*/16);
//   absl::Status s = bounded.TrySchedule([&] { Work(); });
//   // RESOURCE_EXHAUSTED: 4 tasks run and 16 wait already; nothing queued.
//
// Safe for concurrent use: Schedule, TrySchedule and Stop may be called from
// any thread (Stop not from one of the pool's own tasks, which would wait for
// itself). Tasks start in FIFO order; with more than one thread they run
// concurrently, so only a one-thread pool runs them one at a time in order.
// A task must not throw (an escaping exception ends the process, as for any
// std::thread).

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace rlmesh {

class ThreadPool {
 public:
  // `max_queued` for a pool that holds any number of tasks.
  static constexpr int kNoQueueLimit = -1;

  // Starts `threads` threads named `name` (as ps and gdb show it; cut to the
  // 15 characters Linux keeps). With max_queued >= 0 the pool holds at most
  // threads + max_queued tasks accepted and not yet finished (running or
  // waiting); a task past that is refused. REQUIRES: threads > 0,
  // max_queued >= 0 or kNoQueueLimit.
  ThreadPool(int threads, std::string name, int max_queued = kNoQueueLimit);
  // Stop().
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`. Returns false, and drops `task` without running it, once
  // Stop() has begun or when the pool is full: the caller answers for work
  // the pool refused.
  [[nodiscard]] bool Schedule(std::function<void()> task);

  // Schedule, saying why a task was refused: RESOURCE_EXHAUSTED when the
  // pool already holds threads + max_queued tasks (the message names both),
  // UNAVAILABLE once Stop() has begun. OK when queued.
  absl::Status TrySchedule(std::function<void()> task);

  // Drains: refuses new tasks, runs every task already queued, then joins
  // the threads. Idempotent; every caller returns after the join.
  // REQUIRES: not called from one of this pool's tasks.
  void Stop();

  int size() const { return static_cast<int>(threads_.size()); }
  int max_queued() const { return max_queued_; }
  // Tasks accepted and not yet finished, running or waiting.
  int unfinished() const;

 private:
  void Work();

  // Constant after construction.
  const std::string name_;
  const int max_queued_;

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  // Accepted and not yet finished: queue_ plus those running.
  int unfinished_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Held while joining, so a second Stop() waits for the first's join.
  absl::Mutex join_mu_;
  std::vector<std::thread> threads_;  // filled in the constructor; joined under join_mu_
};

}  // namespace rlmesh
