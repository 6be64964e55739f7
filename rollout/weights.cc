// Rollout worker: weight updates. A checkpoint load or a weight-sync
// receive runs on the caller's thread (under load_mu, one at a time) while
// generation goes on; the swap itself is posted to the engine thread, which
// applies it at the fence (engine.cc).

#include <map>
#include <set>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "actor/checkpoint.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "rollout/worker_impl.h"
#include "weight_sync/weight_sync.h"

namespace rlmesh::rollout {

using weight_sync::CreateWeightReceiver;
using weight_sync::NamedTensors;

namespace {

// Holds load_mu, taken by a deadline (absl::Mutex has no timed lock: polls
// TryLock). Movable so it can come back in a StatusOr; unlocks once.
class LoadTurn {
 public:
  static absl::StatusOr<LoadTurn> Take(absl::Mutex* mu, absl::Time deadline) {
    while (!mu->TryLock()) {
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(
            "another weight load or sync configuration is still in progress on this worker; retry");
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    return LoadTurn(mu);
  }
  LoadTurn(LoadTurn&& other) noexcept : mu_(std::exchange(other.mu_, nullptr)) {}
  LoadTurn& operator=(LoadTurn&&) = delete;
  ~LoadTurn() {
    if (mu_ != nullptr) mu_->Unlock();
  }

 private:
  explicit LoadTurn(absl::Mutex* mu) : mu_(mu) {}
  absl::Mutex* mu_;
};

}  // namespace

absl::StatusOr<LoadResult> RolloutWorker::LoadCheckpoint(const std::string& path, int64_t version,
                                                         absl::Time deadline) {
  const absl::Time start = absl::Now();
  RLMESH_ASSIGN_OR_RETURN(LoadTurn load_lock, LoadTurn::Take(&impl_->load_mu, deadline));
  int64_t v;
  {
    absl::MutexLock lock(&impl_->mu);
    v = version != 0 ? version : impl_->version + 1;
    RLMESH_RETURN_IF_ERROR(impl_->CheckVersion(v));
  }
  actor::LoadOptions lo;
  lo.dtype = impl_->options.dtype;
  lo.device = impl_->options.device;
  if (path.empty()) return absl::InvalidArgumentError("checkpoint_path: must not be empty");
  absl::StatusOr<actor::Transformer> loaded = actor::LoadHfModel(path, lo);
  if (!loaded.ok()) return loaded.status();
  actor::Transformer model = *loaded;
  int64_t bytes = 0;
  std::map<std::string, Impl::ParamInfo> params;
  for (const auto& [name, t] : model->NamedParameters()) {
    bytes += static_cast<int64_t>(t.nbytes());
    params[name].shape = t.sizes().vec();
  }
  if (impl_->tokenizer && impl_->tokenizer->vocab_size() > model->config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_path: model vocab_size ", model->config().vocab_size,
                                                   " is smaller than the tokenizer's ", impl_->tokenizer->vocab_size()));
  }
  auto u = std::make_shared<Impl::Update>();
  u->version = v;
  u->model_id = path;
  Impl* impl = impl_.get();
  if (impl_->options.tensor_parallel > 1) {
    // The ranks take their slices here, while generation goes on; the
    // fence only swaps the engines. The whole model is dropped after.
    auto ready = std::make_shared<std::unique_ptr<TensorParallelEngine>>();
    RLMESH_ASSIGN_OR_RETURN(*ready, impl_->MakeTensorParallel(model->config(), model->NamedParameters()));
    for (int r = 0; r < (*ready)->tp(); ++r) u->rank_bytes.push_back((*ready)->ParameterBytes(r));
    u->apply = [impl, ready]() -> absl::Status {
      impl->gen.reset();  // the old ranks end before the new ones take over
      impl->gen = std::move(*ready);
      return absl::OkStatus();
    };
  } else {
    u->rank_bytes = {bytes};
    u->apply = [impl, model]() -> absl::Status {
      impl->model = model;
      return absl::OkStatus();
    };
  }
  u->config = model->config();
  u->params = std::move(params);
  RLMESH_RETURN_IF_ERROR(impl_->PostUpdate(u));
  RLMESH_LOG(INFO) << "loaded checkpoint path=" << path << " version=" << v;
  return LoadResult{v, bytes, absl::ToDoubleSeconds(absl::Now() - start)};
}

absl::Status RolloutWorker::ConfigureWeightSync(const WeightSyncSpec& spec, absl::Time deadline) {
  RLMESH_ASSIGN_OR_RETURN(auto receiver, CreateWeightReceiver(spec));
  RLMESH_ASSIGN_OR_RETURN(LoadTurn load_lock, LoadTurn::Take(&impl_->load_mu, deadline));
  impl_->receiver = std::move(receiver);
  impl_->sync_group = spec.group_name();
  impl_->staging.clear();
  RLMESH_LOG(INFO) << "weight sync configured backend=" << WeightSyncBackend_Name(impl_->receiver->backend())
                   << " group=" << spec.group_name() << " rank=" << spec.rank();
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> RolloutWorker::LoadFromSync(const WeightLayout& layout, int64_t version,
                                                       absl::Time deadline) {
  const absl::Time start = absl::Now();
  RLMESH_ASSIGN_OR_RETURN(LoadTurn load_lock, LoadTurn::Take(&impl_->load_mu, deadline));
  if (!impl_->receiver) {
    return absl::FailedPreconditionError("weight sync is not configured: call ConfigureWeightSync first");
  }
  WeightLayout expected = layout;
  if (expected.version() == 0) expected.set_version(version);
  if (expected.version() <= 0) return absl::InvalidArgumentError("sync.version: must be > 0 (or set version)");
  // Receive first, whatever the state: for a collective backend the
  // publisher is sending now and must not be left hanging.
  WeightLayout received;
  NamedTensors tensors;
  if (impl_->staging.empty()) {
    RLMESH_ASSIGN_OR_RETURN(tensors, impl_->receiver->Receive(expected, &received));
  } else {
    // Reuse the previous round's buffers (warm memory: the fast path).
    RLMESH_RETURN_IF_ERROR(impl_->receiver->ReceiveInto(expected, impl_->staging, &received));
    tensors = impl_->staging;
  }
  const int64_t v = version != 0 ? version : received.version();
  int64_t bytes = 0;
  {
    absl::MutexLock lock(&impl_->mu);
    RLMESH_RETURN_IF_ERROR(impl_->CheckVersion(v));
    if (!impl_->config) {
      return absl::FailedPreconditionError("no model loaded: LoadWeights(checkpoint_path) once before a sync");
    }
    // Every parameter exactly once, with its shape: checked before the fence
    // so that a bad layout never leaves the model half-written.
    std::set<std::string> seen;
    for (const auto& [name, t] : tensors) {
      auto it = impl_->params.find(name);
      if (it == impl_->params.end()) {
        return absl::InvalidArgumentError(absl::StrCat("sync.tensors[", name, "]: not a parameter of the model"));
      }
      if (t.sizes().vec() != it->second.shape) {
        return absl::InvalidArgumentError(absl::StrCat("sync.tensors[", name, "].shape: does not match the model"));
      }
      seen.insert(name);
      bytes += static_cast<int64_t>(t.nbytes());
    }
    for (const auto& [name, info] : impl_->params) {
      if (!seen.count(name)) return absl::InvalidArgumentError(absl::StrCat("sync.tensors: missing ", name));
    }
  }
  auto u = std::make_shared<Impl::Update>();
  u->version = v;
  u->model_id = absl::StrCat("weight_sync:", impl_->sync_group.empty() ? "default" : impl_->sync_group);
  Impl* impl = impl_.get();
  // This round's tensors become the next round's buffers, except under
  // tensor parallelism: there the ranks hold slices so that the whole
  // policy does not stay in memory, and the buffers are freed once copied.
  if (impl_->options.tensor_parallel == 1) impl_->staging = tensors;
  auto staged = std::make_shared<NamedTensors>(std::move(tensors));
  if (impl_->options.tensor_parallel > 1) {
    actor::ModelConfig config;
    {
      absl::MutexLock lock(&impl_->mu);
      config = *impl_->config;
    }
    // At the fence the ranks are idle: each copies its slice in place. A
    // broken engine (a failed collective) is replaced by a new one.
    u->apply = [impl, staged, config]() -> absl::Status {
      TensorParallelEngine* engine = impl->tp_engine();
      if (engine != nullptr && engine->broken().ok()) return engine->Load(*staged);
      impl->gen.reset();
      RLMESH_ASSIGN_OR_RETURN(impl->gen, impl->MakeTensorParallel(config, *staged));
      return absl::OkStatus();
    };
  } else {
    u->apply = [impl, staged]() -> absl::Status {
      at::NoGradGuard no_grad;
      std::map<std::string, at::Tensor> params;
      for (auto& [name, p] : impl->model->NamedParameters()) params[name] = p;
      for (auto& [name, t] : *staged) params.at(name).copy_(t);
      return absl::OkStatus();
    };
  }
  RLMESH_RETURN_IF_ERROR(impl_->PostUpdate(u));
  RLMESH_LOG(INFO) << "received weights version=" << v << " bytes=" << bytes
                   << " tensor_parallel=" << impl_->options.tensor_parallel;
  return LoadResult{v, bytes, absl::ToDoubleSeconds(absl::Now() - start)};
}

absl::StatusOr<std::unique_ptr<TensorParallelEngine>> RolloutWorker::Impl::MakeTensorParallel(
    const actor::ModelConfig& config, const weight_sync::NamedTensors& full) {
  TensorParallelEngineOptions o;
  o.tp = options.tensor_parallel;
  o.generator.max_batch = options.max_batch;
  o.generator.max_prefill_tokens = options.max_prefill_tokens;
  absl::StatusOr<std::unique_ptr<TensorParallelEngine>> engine = TensorParallelEngine::Create(config, o);
  if (!engine.ok()) {
    return absl::Status(engine.status().code(),
                        absl::StrCat("tensor_parallel=", o.tp, ": ", engine.status().message()));
  }
  RLMESH_RETURN_IF_ERROR((*engine)->Load(full));
  return engine;
}

}  // namespace rlmesh::rollout
