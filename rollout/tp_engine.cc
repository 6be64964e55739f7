#include "rollout/tp_engine.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "dist/device.h"
#include "dist/gloo.h"
#include "parallel/tensor_parallel.h"

namespace rlmesh::rollout {
namespace {

// A rank's slice as the Generator's model: its own key/value heads in the
// cache, logits gathered over the group.
class SliceModel : public actor::GenerationModel {
 public:
  explicit SliceModel(parallel::TensorParallelModel* m) : m_(m) {}
  const actor::ModelConfig& config() const override { return m_->config(); }
  torch::Device device() const override { return torch::kCPU; }
  torch::Tensor Prefill(const torch::Tensor& ids, const torch::Tensor& lens, int64_t capacity,
                        actor::KvCache* cache) override {
    return m_->Prefill(ids, lens, capacity, cache);
  }
  torch::Tensor DecodeStep(const torch::Tensor& ids, const torch::Tensor& lens, int64_t max_len,
                           actor::KvCache* cache) override {
    return m_->DecodeStep(ids, lens, max_len, cache);
  }
  torch::Tensor Logits(const torch::Tensor& hidden) override { return m_->Logits(hidden); }
  // MoE architectures are refused at Create: nothing to record.
  void set_routing(actor::MoeRouting*) override {}

 private:
  parallel::TensorParallelModel* m_;
};

}  // namespace

struct TensorParallelEngine::Rank {
  int index = 0;
  c10::intrusive_ptr<c10d::Backend> group;
  std::unique_ptr<parallel::TensorParallelModel> model;
  std::unique_ptr<actor::Generator> gen;
  // Ranks > 0: the thread and its one-job mailbox.
  std::thread thread;
  absl::Mutex mu;
  const std::function<absl::Status(Rank&)>* job ABSL_GUARDED_BY(mu) = nullptr;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status result ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;

  void Loop() {
    while (true) {
      const std::function<absl::Status(Rank&)>* j;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](Rank* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu) { return r->stop || r->job != nullptr; }, this));
        if (job == nullptr) return;  // stop with nothing to run
        j = job;
      }
      absl::Status s = Run(*j);
      absl::MutexLock lock(&mu);
      job = nullptr;
      result = s;
      done = true;
    }
  }

  absl::Status Run(const std::function<absl::Status(Rank&)>& j) {
    try {
      return j(*this);
    } catch (const std::exception& e) {
      return dist::ExceptionStatus(e, absl::StatusCode::kAborted, absl::StrCat("tensor-parallel rank ", index));
    }
  }
};

absl::Status TensorParallelEngineOptions::Validate() const {
  if (tp < 1) return absl::InvalidArgumentError(absl::StrCat("tp: ", tp, " must be >= 1"));
  if (timeout_ms <= 0) return absl::InvalidArgumentError("timeout_ms: must be > 0");
  return generator.Validate();
}

absl::StatusOr<std::unique_ptr<TensorParallelEngine>> TensorParallelEngine::Create(
    const actor::ModelConfig& config, const TensorParallelEngineOptions& options) {
  RLMESH_RETURN_IF_ERROR(options.Validate());
  RLMESH_RETURN_IF_ERROR(parallel::ValidateTensorParallel(config, options.tp));
  std::unique_ptr<TensorParallelEngine> e(new TensorParallelEngine());
  for (int r = 0; r < options.tp; ++r) {
    e->ranks_.push_back(std::make_unique<Rank>());
    e->ranks_.back()->index = r;
  }
  for (int r = 1; r < options.tp; ++r) {
    Rank* rank = e->ranks_[r].get();
    rank->thread = std::thread([rank] { rank->Loop(); });
  }
  // Every rank joins the group (CreateGlooGroup blocks until all have) and
  // makes its slice and its Generator.
  auto store = c10::make_intrusive<c10d::HashStore>();
  dist::GlooGroupOptions go;
  go.timeout_ms = options.timeout_ms;
  const int tp = options.tp;
  const actor::GeneratorOptions gen_options = options.generator;
  RLMESH_RETURN_IF_ERROR(e->RunOnAll([&](Rank& rank) -> absl::Status {
    if (tp > 1) {
      RLMESH_ASSIGN_OR_RETURN(rank.group, dist::CreateGlooGroup(store, rank.index, tp, go));
    }
    RLMESH_ASSIGN_OR_RETURN(rank.model, parallel::TensorParallelModel::Create(config, rank.group));
    rank.gen = std::make_unique<actor::Generator>(std::make_shared<SliceModel>(rank.model.get()), gen_options);
    return absl::OkStatus();
  }));
  return e;
}

TensorParallelEngine::~TensorParallelEngine() {
  for (auto& r : ranks_) {
    if (!r->thread.joinable()) continue;
    {
      absl::MutexLock lock(&r->mu);
      r->stop = true;
    }
    r->thread.join();
  }
}

absl::Status TensorParallelEngine::RunOnAll(const std::function<absl::Status(Rank&)>& job) {
  if (!broken_.ok()) return broken_;
  for (size_t r = 1; r < ranks_.size(); ++r) {
    absl::MutexLock lock(&ranks_[r]->mu);
    ranks_[r]->job = &job;
    ranks_[r]->done = false;
  }
  absl::Status first = ranks_[0]->Run(job);
  for (size_t r = 1; r < ranks_.size(); ++r) {
    Rank* rank = ranks_[r].get();
    absl::MutexLock lock(&rank->mu);
    rank->mu.Await(absl::Condition(
        +[](Rank* x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(x->mu) { return x->done; }, rank));
    if (first.ok()) first = rank->result;
  }
  // A collective that failed leaves the group unusable.
  if (absl::IsAborted(first)) broken_ = first;
  return first;
}

absl::Status TensorParallelEngine::Load(const Named& full) {
  if (!Idle()) return absl::FailedPreconditionError("Load: requests are queued or running");
  return RunOnAll([&](Rank& rank) { return rank.model->LoadFromFull(full); });
}

absl::Status TensorParallelEngine::LoadSlices(const std::vector<Named>& slices) {
  if (!Idle()) return absl::FailedPreconditionError("LoadSlices: requests are queued or running");
  if (slices.size() != ranks_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slices: ", slices.size(), " given for ", ranks_.size(), " ranks"));
  }
  return RunOnAll([&](Rank& rank) { return rank.model->LoadSlices(slices[rank.index]); });
}

absl::Status TensorParallelEngine::Submit(actor::GenerationRequest request) {
  if (!broken_.ok()) return broken_;
  // Rank 0 validates; the others, given the same request, then accept it.
  actor::GenerationRequest copy = request;
  RLMESH_RETURN_IF_ERROR(ranks_[0]->gen->Submit(std::move(copy)));
  if (ranks_.size() == 1) return absl::OkStatus();
  absl::Status s = RunOnAll([&](Rank& rank) -> absl::Status {
    if (rank.index == 0) return absl::OkStatus();
    return rank.gen->Submit(request);
  });
  // The ranks validate alike, so this cannot happen; if it did, their
  // queues would differ from here on.
  if (!s.ok() && broken_.ok()) broken_ = absl::AbortedError(absl::StrCat("ranks disagree on a request: ", s.message()));
  return s;
}

absl::Status TensorParallelEngine::Step(const actor::GroupCallback& on_group) {
  std::vector<actor::GroupResult> finished;
  absl::Status s = RunOnAll([&](Rank& rank) -> absl::Status {
    if (rank.index != 0) return rank.gen->Step(nullptr);
    return rank.gen->Step([&](actor::GroupResult g) { finished.push_back(std::move(g)); });
  });
  if (!s.ok()) {
    // The ranks may have stopped at different collectives: their caches
    // and the group can no longer be trusted.
    if (broken_.ok()) broken_ = absl::AbortedError(absl::StrCat("tensor-parallel step failed: ", s.message()));
    return broken_;
  }
  if (on_group) {
    for (auto& g : finished) on_group(std::move(g));
  }
  return absl::OkStatus();
}

std::vector<actor::GroupResult> TensorParallelEngine::Abort() {
  // No collective: every rank drops its rows and queue on its own.
  std::vector<actor::GroupResult> out = ranks_[0]->gen->Abort();
  for (size_t r = 1; r < ranks_.size(); ++r) ranks_[r]->gen->Abort();
  return out;
}

bool TensorParallelEngine::Idle() const { return ranks_[0]->gen->Idle(); }

int64_t TensorParallelEngine::running() const { return ranks_[0]->gen->running(); }

int64_t TensorParallelEngine::ParameterBytes(int rank) const {
  int64_t bytes = 0;
  for (const auto& t : ranks_[rank]->model->Parameters()) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

}  // namespace rlmesh::rollout
