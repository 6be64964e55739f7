// The package's only LibTorch translation unit.
#include "reward_server/reward_model.h"

#include <algorithm>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/str_cat.h"
#include "actor/checkpoint.h"
#include "actor/transformer.h"
#include "common/status_macros.h"

namespace rlmesh {

struct RewardModel::Model {
  actor::Transformer net{nullptr};
  torch::Device device{torch::kCPU};
};

// The waiting side of one Score call; filled by the batcher.
struct RewardModel::Request {
  absl::Mutex mu;
  int remaining ABSL_GUARDED_BY(mu) = 0;
  std::vector<double> scores ABSL_GUARDED_BY(mu);
  absl::Status status ABSL_GUARDED_BY(mu);
  // Set when the caller gave up (deadline): the batcher skips its jobs.
  std::atomic<bool> abandoned{false};
};

namespace {

// FNV-1a over the lengths and ids, then a final avalanche (splitmix64), so
// that ("ab", "c") and ("a", "bc") hash apart.
uint64_t HashIds(int prompt_len, const std::vector<int64_t>& ids) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<uint64_t>(prompt_len));
  mix(ids.size());
  for (int64_t id : ids) mix(static_cast<uint64_t>(id));
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace

absl::Status RewardModelOptions::Validate() const {
  if (max_batch <= 0) return absl::InvalidArgumentError("max_batch: must be > 0");
  if (max_wait < absl::ZeroDuration()) return absl::InvalidArgumentError("max_wait: must be >= 0");
  if (cache_size < 0) return absl::InvalidArgumentError("cache_size: must be >= 0");
  if (threads < 0) return absl::InvalidArgumentError("threads: must be >= 0");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RewardModel>> RewardModel::Load(const std::string& dir,
                                                               const RewardModelOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  if (options.threads > 0) actor::ConfigureThreads(options.threads);
  actor::LoadOptions lo;
  lo.dtype = options.dtype;
  lo.device = options.device;
  auto model = std::make_unique<Model>();
  auto loaded = actor::LoadHfModel(dir, lo);
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat("reward model ", dir, ": ", loaded.status().message()));
  }
  model->net = *loaded;
  if (!model->net->config().value_head || model->net->score.is_empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reward model ", dir, ": config.json has no scalar head (score.weight); not a reward model"));
  }
  try {
    model->device = torch::Device(options.device);
    model->net->eval();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("reward model ", dir, ": ", e.what_without_backtrace()));
  }
  return std::unique_ptr<RewardModel>(new RewardModel(dir, options, std::move(model)));
}

RewardModel::RewardModel(std::string dir, RewardModelOptions options, std::unique_ptr<Model> model)
    : dir_(std::move(dir)), options_(std::move(options)), model_(std::move(model)) {
  batcher_ = std::thread([this] { RunBatcher(); });
}

RewardModel::~RewardModel() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  batcher_.join();
}

int64_t RewardModel::vocab_size() const { return model_->net->config().vocab_size; }
int64_t RewardModel::max_positions() const { return model_->net->config().max_positions; }

RewardModelStats RewardModel::stats() const {
  RewardModelStats s;
  {
    absl::MutexLock lock(&mu_);
    s.items_run = items_run_;
    s.batches = batches_;
  }
  s.passes = passes_.load();
  s.timeouts = timeouts_.load();
  s.items_dropped = items_dropped_.load();
  absl::MutexLock lock(&cache_mu_);
  s.cache_hits = cache_hits_;
  return s;
}

bool RewardModel::CacheLookup(uint64_t key, int prompt_len, const std::vector<int64_t>& ids, double* score) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  if (it->second->prompt_len != prompt_len || it->second->ids != ids) return false;  // a collision
  lru_.splice(lru_.begin(), lru_, it->second);
  *score = it->second->score;
  return true;
}

void RewardModel::CacheInsert(uint64_t key, int prompt_len, std::vector<int64_t> ids, double score) {
  if (options_.cache_size == 0) return;
  auto it = index_.find(key);
  if (it != index_.end()) {
    // Same key (a repeat, or a colliding item): the newest result wins.
    *it->second = CacheEntry{key, prompt_len, std::move(ids), score};
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(CacheEntry{key, prompt_len, std::move(ids), score});
  index_[key] = lru_.begin();
  while (static_cast<int64_t>(lru_.size()) > options_.cache_size) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

absl::StatusOr<std::vector<double>> RewardModel::Score(const std::vector<RewardModelItem>& items,
                                                       absl::Time deadline) {
  const int64_t vocab = vocab_size();
  const int64_t max_len = max_positions();
  const int n = static_cast<int>(items.size());
  // Validate everything before anything is queued.
  for (int i = 0; i < n; ++i) {
    const RewardModelItem& item = items[i];
    const size_t len = item.prompt_ids.size() + item.completion_ids.size();
    if (len == 0) return absl::InvalidArgumentError(absl::StrCat("items[", i, "]: prompt and completion are both empty"));
    if (static_cast<int64_t>(len) > max_len) {
      return absl::InvalidArgumentError(absl::StrCat("items[", i, "]: ", len, " tokens exceed the reward model's ",
                                                     max_len, " positions"));
    }
    for (const auto* field : {&item.prompt_ids, &item.completion_ids}) {
      for (int id : *field) {
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat("items[", i, "].",
                                                         field == &item.prompt_ids ? "prompt" : "completion",
                                                         "_token_ids: id ", id, " not in the reward model's vocab [0, ",
                                                         vocab, ")"));
        }
      }
    }
  }

  auto request = std::make_shared<Request>();
  std::vector<double> scores(n, 0.0);
  std::vector<Job> jobs;
  {
    absl::MutexLock lock(&cache_mu_);
    for (int i = 0; i < n; ++i) {
      Job job;
      job.prompt_len = static_cast<int>(items[i].prompt_ids.size());
      job.ids.reserve(items[i].prompt_ids.size() + items[i].completion_ids.size());
      job.ids.insert(job.ids.end(), items[i].prompt_ids.begin(), items[i].prompt_ids.end());
      job.ids.insert(job.ids.end(), items[i].completion_ids.begin(), items[i].completion_ids.end());
      job.key = HashIds(job.prompt_len, job.ids);
      if (options_.cache_size > 0 && CacheLookup(job.key, job.prompt_len, job.ids, &scores[i])) {
        ++cache_hits_;
        continue;
      }
      job.request = request;
      job.index = i;
      jobs.push_back(std::move(job));
    }
  }
  if (jobs.empty()) return scores;
  std::vector<int> queued;
  for (const Job& job : jobs) queued.push_back(job.index);
  {
    absl::MutexLock lock(&request->mu);
    request->remaining = static_cast<int>(jobs.size());
    request->scores.assign(n, 0.0);
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("reward model is shutting down");
    const absl::Time now = absl::Now();
    for (auto& job : jobs) {
      job.enqueued = now;
      queue_.push_back(std::move(job));
    }
  }
  absl::MutexLock lock(&request->mu);
  if (!request->mu.AwaitWithDeadline(
          absl::Condition(+[](Request* r) ABSL_NO_THREAD_SAFETY_ANALYSIS { return r->remaining == 0; },
                          request.get()),
          deadline)) {
    request->abandoned.store(true);
    timeouts_.fetch_add(1);
    return absl::DeadlineExceededError(absl::StrCat("reward model: ", request->remaining, " of ", jobs.size(),
                                                    " items not scored by the deadline"));
  }
  RLMESH_RETURN_IF_ERROR(request->status);
  // Cached items stay in `scores`; the batcher filled the rest.
  for (int i : queued) scores[i] = request->scores[i];
  return scores;
}

void RewardModel::RunBatcher() {
  // OpenMP thread counts are per thread: apply the setting here too.
  if (options_.threads > 0) actor::ConfigureThreads(options_.threads);
  const size_t max_batch = static_cast<size_t>(options_.max_batch);
  while (true) {
    std::vector<Job> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) break;
      // Wait for a full batch, until the oldest item has waited max_wait.
      auto full = [this, max_batch]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || queue_.size() >= max_batch;
      };
      mu_.AwaitWithDeadline(absl::Condition(&full), queue_.front().enqueued + options_.max_wait);
      if (stopping_) break;
      // Jobs of calls that gave up are dropped, not run.
      while (!queue_.empty() && batch.size() < max_batch) {
        if (queue_.front().request->abandoned.load()) {
          items_dropped_.fetch_add(1);
        } else {
          batch.push_back(std::move(queue_.front()));
        }
        queue_.pop_front();
      }
      if (batch.empty()) continue;
      items_run_ += static_cast<int64_t>(batch.size());
      ++batches_;
    }
    absl::StatusOr<std::vector<double>> out = Forward(batch);
    if (out.ok()) {
      absl::MutexLock lock(&cache_mu_);
      for (size_t i = 0; i < batch.size(); ++i) {
        CacheInsert(batch[i].key, batch[i].prompt_len, batch[i].ids, (*out)[i]);
      }
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      Request* r = batch[i].request.get();
      absl::MutexLock lock(&r->mu);
      if (out.ok()) {
        r->scores[batch[i].index] = (*out)[i];
      } else if (r->status.ok()) {
        r->status = out.status();
      }
      --r->remaining;
    }
  }
  // Stopping: whatever is still queued is answered, never left waiting.
  std::deque<Job> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(queue_);
  }
  for (Job& job : left) {
    absl::MutexLock lock(&job.request->mu);
    if (job.request->status.ok()) job.request->status = absl::CancelledError("reward model is shutting down");
    --job.request->remaining;
  }
}

absl::StatusOr<std::vector<double>> RewardModel::Forward(const std::vector<Job>& jobs) {
  // Longest first, then cut into passes whose padding stays under a quarter
  // of their tokens: a batch of mixed lengths costs little more than its
  // real tokens.
  std::vector<size_t> order(jobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return jobs[a].ids.size() > jobs[b].ids.size(); });
  std::vector<double> out(jobs.size());
  size_t begin = 0;
  while (begin < order.size()) {
    const size_t T = jobs[order[begin]].ids.size();
    size_t end = begin + 1;
    size_t real = T;
    while (end < order.size()) {
      const size_t len = jobs[order[end]].ids.size();
      if (T * (end - begin + 1) * 3 > (real + len) * 4) break;  // padding > 25%
      real += len;
      ++end;
    }
    RLMESH_RETURN_IF_ERROR(ForwardPass(jobs, order, begin, end, &out));
    passes_.fetch_add(1);
    begin = end;
  }
  return out;
}

absl::Status RewardModel::ForwardPass(const std::vector<Job>& jobs, const std::vector<size_t>& order, size_t begin,
                                      size_t end, std::vector<double>* out) {
  const int64_t B = static_cast<int64_t>(end - begin);
  const int64_t T = static_cast<int64_t>(jobs[order[begin]].ids.size());  // the longest
  try {
    c10::InferenceMode guard;
    // Right-padded: row r's real tokens are [0, len_r) at positions 0.., and
    // attention is causal, so no real token sees a pad and a row's values do
    // not depend on what it is batched with. No key mask is needed, which
    // keeps attention on the fused causal kernel.
    at::Tensor ids = at::zeros({B, T}, at::kLong);
    at::Tensor last = at::empty({B}, at::kLong);
    auto ids_a = ids.accessor<int64_t, 2>();
    auto last_a = last.accessor<int64_t, 1>();
    for (int64_t r = 0; r < B; ++r) {
      const auto& row = jobs[order[begin + r]].ids;
      for (size_t t = 0; t < row.size(); ++t) ids_a[r][t] = row[t];
      last_a[r] = static_cast<int64_t>(row.size()) - 1;
    }
    at::Tensor positions = at::arange(T, at::kLong).unsqueeze(0).expand({B, T}).contiguous();
    const torch::Device dev = model_->device;
    at::Tensor values = model_->net->Values(ids.to(dev), positions.to(dev));  // [B,T]
    at::Tensor picked = values.gather(1, last.to(dev).unsqueeze(1)).squeeze(1).to(at::kCPU, at::kDouble);
    auto p = picked.accessor<double, 1>();
    for (int64_t r = 0; r < B; ++r) (*out)[order[begin + r]] = p[r];
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("reward model ", dir_, ": forward failed: ", e.what_without_backtrace()));
  }
}

}  // namespace rlmesh
