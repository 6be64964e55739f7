#pragma once

// ThreadPool: a fixed set of threads draining one FIFO of tasks.
//
//   ThreadPool pool(4, "rb-write");
//   if (!pool.Schedule([&] { Work(); })) { /* stopping: not run */ }
//   pool.Stop();  // runs what is queued, then joins
//
// Safe for concurrent use: Schedule and Stop may be called from any thread
// (Stop not from one of the pool's own tasks, which would wait for itself).
// Tasks start in FIFO order; with more than one thread they run
// concurrently, so only a one-thread pool runs them one at a time in order.
// A task must not throw (an escaping exception ends the process, as for any
// std::thread).

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rlmesh {

class ThreadPool {
 public:
  // Starts `threads` threads named `name` (as ps and gdb show it; cut to the
  // 15 characters Linux keeps). REQUIRES: threads > 0.
  ThreadPool(int threads, std::string name);
  // Stop().
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`. Returns false, and drops `task` without running it, once
  // Stop() has begun: the caller answers for work the pool refused.
  [[nodiscard]] bool Schedule(std::function<void()> task);

  // Drains: refuses new tasks, runs every task already queued, then joins
  // the threads. Idempotent; every caller returns after the join.
  // REQUIRES: not called from one of this pool's tasks.
  void Stop();

  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Work();

  // Constant after construction.
  const std::string name_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Held while joining, so a second Stop() waits for the first's join.
  absl::Mutex join_mu_;
  std::vector<std::thread> threads_;  // filled in the constructor; joined under join_mu_
};

}  // namespace rlmesh
