#include "common/thread_pool.h"

#include <pthread.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace rlmesh {

ThreadPool::ThreadPool(int threads, std::string name, int max_queued)
    : name_(std::move(name)), max_queued_(max_queued) {
  threads_.reserve(threads > 0 ? threads : 0);
  const std::string short_name = name_.substr(0, 15);  // Linux keeps 15 + NUL
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { Work(); });
    // Naming is for people reading ps/gdb; a failure changes nothing else.
    (void)pthread_setname_np(threads_.back().native_handle(), short_name.c_str());
  }
}

ThreadPool::~ThreadPool() { Stop(); }

bool ThreadPool::Schedule(std::function<void()> task) { return TrySchedule(std::move(task)).ok(); }

absl::Status ThreadPool::TrySchedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError(absl::StrCat(name_, ": thread pool is stopping"));
  // Counting running tasks as well as waiting ones makes the limit exact: a
  // task handed to an idle thread that has not yet woken still holds a slot.
  if (max_queued_ != kNoQueueLimit && unfinished_ >= size() + max_queued_) {
    return absl::ResourceExhaustedError(absl::StrCat(name_, ": all ", size(), " threads busy and ", max_queued_,
                                                     " tasks queued (the limit)"));
  }
  queue_.push_back(std::move(task));
  ++unfinished_;
  return absl::OkStatus();
}

int ThreadPool::unfinished() const {
  absl::MutexLock lock(&mu_);
  return unfinished_;
}

void ThreadPool::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::MutexLock join_lock(&join_mu_);
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void ThreadPool::Work() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
    // Destroy the task (and what it captured) before its slot frees, so a
    // full pool never holds more than its limit of captured state.
    task = nullptr;
    absl::MutexLock lock(&mu_);
    --unfinished_;
  }
}

}  // namespace rlmesh
