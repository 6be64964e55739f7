#pragma once

// A reward model: an actor/ transformer with a scalar head ("score.weight")
// loaded from a Hugging Face folder. The score of a (prompt, completion) is
// the head's value at the last token of prompt+completion.
//
// Concurrent Score calls are merged by a dynamic batcher (one worker thread
// owns the model) and results are kept in a bounded LRU cache keyed by a hash
// of the token ids. This header includes no LibTorch.

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rlmesh {

struct RewardModelOptions {
  // Most items in one forward pass. Default 32.
  int max_batch = 32;
  // Longest an item waits in the queue for batch mates (measured from its
  // enqueue time, so items that queued during a busy pass go at once).
  // Default 5 ms.
  absl::Duration max_wait = absl::Milliseconds(5);
  // Results kept in the LRU cache, items; 0 disables the cache. Default 65536.
  int64_t cache_size = 65536;
  // LibTorch intra-op threads; 0 leaves the process setting alone. Default 0.
  int threads = 0;
  // Parameter dtype: "fp32", "bf16" or "fp16". Default "fp32".
  std::string dtype = "fp32";
  // "cpu" or "cuda[:i]". Default "cpu".
  std::string device = "cpu";

  absl::Status Validate() const;
};

// One item to score: token ids of the prompt and of the completion.
struct RewardModelItem {
  std::vector<int> prompt_ids;
  std::vector<int> completion_ids;
};

struct RewardModelStats {
  // Items answered from the cache.
  int64_t cache_hits = 0;
  // Items that ran through the model.
  int64_t items_run = 0;
  // Batches the batcher formed (one batch may run as several
  // length-bucketed forward passes).
  int64_t batches = 0;
  // Forward passes run.
  int64_t passes = 0;
  // Score calls that hit their deadline, and their items dropped unrun.
  int64_t timeouts = 0;
  int64_t items_dropped = 0;
  // items_run / batches (0 when none ran).
  double mean_batch_size() const { return batches == 0 ? 0.0 : static_cast<double>(items_run) / batches; }
};

// Safe for concurrent use.
class RewardModel {
 public:
  // Loads `dir` (config.json with a value head + safetensors). Errors name
  // the folder. Starts the batcher thread.
  static absl::StatusOr<std::unique_ptr<RewardModel>> Load(const std::string& dir,
                                                           const RewardModelOptions& options = {});
  // Stops the batcher; pending calls get CANCELLED.
  ~RewardModel();
  RewardModel(const RewardModel&) = delete;
  RewardModel& operator=(const RewardModel&) = delete;

  // One score per item, in order. Blocks until the batcher has run them.
  // Bad items (empty, id out of range, too long) are INVALID_ARGUMENT naming
  // items[i] before anything runs. A call not answered by `deadline` returns
  // DEADLINE_EXCEEDED; its items still queued are dropped, not run.
  absl::StatusOr<std::vector<double>> Score(const std::vector<RewardModelItem>& items,
                                            absl::Time deadline = absl::InfiniteFuture());

  RewardModelStats stats() const;
  const std::string& dir() const { return dir_; }
  int64_t vocab_size() const;
  int64_t max_positions() const;

 private:
  struct Model;    // Holds the LibTorch module (reward_model.cc).
  struct Request;  // One Score call waiting for its items.
  struct Job {
    std::vector<int64_t> ids;  // prompt + completion
    uint64_t key;
    int prompt_len;
    std::shared_ptr<Request> request;
    int index;  // in the request
    absl::Time enqueued;
  };
  struct CacheEntry {
    uint64_t key;
    int prompt_len;
    std::vector<int64_t> ids;  // compared on a hash hit: no false hits
    double score;
  };

  RewardModel(std::string dir, RewardModelOptions options, std::unique_ptr<Model> model);
  void RunBatcher();
  // Scores a batch, in length-bucketed passes.
  absl::StatusOr<std::vector<double>> Forward(const std::vector<Job>& jobs);
  // One padded forward pass over jobs[order[begin..end)] (longest first).
  absl::Status ForwardPass(const std::vector<Job>& jobs, const std::vector<size_t>& order, size_t begin, size_t end,
                           std::vector<double>* out);
  bool CacheLookup(uint64_t key, int prompt_len, const std::vector<int64_t>& ids, double* score)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu_);
  void CacheInsert(uint64_t key, int prompt_len, std::vector<int64_t> ids, double score)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu_);

  // Constant after construction.
  const std::string dir_;
  const RewardModelOptions options_;
  const std::unique_ptr<Model> model_;  // used by the batcher thread only

  // Guarded by mu_.
  mutable absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t items_run_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> passes_{0};
  std::atomic<int64_t> timeouts_{0};
  std::atomic<int64_t> items_dropped_{0};

  // Guarded by cache_mu_.
  mutable absl::Mutex cache_mu_;
  std::list<CacheEntry> lru_ ABSL_GUARDED_BY(cache_mu_);  // front = most recent
  std::unordered_map<uint64_t, std::list<CacheEntry>::iterator> index_ ABSL_GUARDED_BY(cache_mu_);
  int64_t cache_hits_ ABSL_GUARDED_BY(cache_mu_) = 0;

  std::thread batcher_;
};

}  // namespace rlmesh
