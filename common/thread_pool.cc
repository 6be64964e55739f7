#include "common/thread_pool.h"

#include <pthread.h>

#include <utility>

namespace rlmesh {

ThreadPool::ThreadPool(int threads, std::string name) : name_(std::move(name)) {
  threads_.reserve(threads > 0 ? threads : 0);
  const std::string short_name = name_.substr(0, 15);  // Linux keeps 15 + NUL
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { Work(); });
    // Naming is for people reading ps/gdb; a failure changes nothing else.
    (void)pthread_setname_np(threads_.back().native_handle(), short_name.c_str());
  }
}

ThreadPool::~ThreadPool() { Stop(); }

bool ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  queue_.push_back(std::move(task));
  return true;
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
  }
}

}  // namespace rlmesh
