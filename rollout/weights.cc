// Rollout worker: weight updates. A checkpoint load or a weight-sync
// receive runs on the caller's thread (under load_mu, one at a time) while
// generation goes on; the swap itself is posted to the engine thread, which
// applies it at the fence (engine.cc).

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "actor/checkpoint.h"
#include "actor/lora.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "dist/device.h"
#include "parallel/tensor_parallel.h"
#include "rollout/worker_impl.h"
#include "weight_sync/pieces.h"
#include "weight_sync/weight_sync.h"

namespace rlmesh::rollout {

using weight_sync::CreateWeightReceiver;
using weight_sync::NamedTensors;

namespace {

// Holds load_mu, taken by a deadline (absl::Mutex has no timed lock: polls
// TryLock). Movable so it can come back in a StatusOr; unlocks once. The
// thread-safety analysis cannot follow a lock held inside a StatusOr, so a
// caller states it with load_mu.AssertHeld() (a runtime check too) after Take.
class LoadTurn {
 public:
  // Not analysed: returns with *mu held on the OK path only, held by the
  // returned LoadTurn.
  static absl::StatusOr<LoadTurn> Take(absl::Mutex* mu, absl::Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
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
  impl_->load_mu.AssertHeld();
  int64_t v;
  {
    absl::MutexLock lock(&impl_->mu);
    if (version == 0 && impl_->version == std::numeric_limits<int64_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("version: 0 asks for the loaded version + 1, but the loaded version is the largest (",
                       impl_->version, ")"));
    }
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
    params[name].dtype = t.scalar_type();
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
    RLMESH_ASSIGN_OR_RETURN(*ready, impl_->MakeTensorParallel(model->config()));
    RLMESH_RETURN_IF_ERROR((*ready)->Load(model->NamedParameters()));
    for (int r = 0; r < (*ready)->tp(); ++r) u->rank_bytes.push_back((*ready)->ParameterBytes(r));
    u->apply = [impl, ready]() -> absl::Status {
      impl->gen.reset();  // the old ranks end before the new ones take over
      impl->gen = std::move(*ready);
      return absl::OkStatus();
    };
  } else {
    u->rank_bytes = {bytes};
    u->apply = [impl, model]() -> absl::Status {
      impl->model = model.ptr();
      return absl::OkStatus();
    };
  }
  u->config = model->config();
  u->params = std::move(params);
  RLMESH_RETURN_IF_ERROR(impl_->PostUpdate(u));
  // The next sync may carry other tensors (a LoRA stage's adapters after a
  // full stage): the buffers of the last one are not reused for it.
  impl_->staging.clear();
  RLMESH_LOG(INFO) << "loaded checkpoint path=" << path << " version=" << v;
  return LoadResult{v, bytes, absl::ToDoubleSeconds(absl::Now() - start)};
}

absl::Status RolloutWorker::ConfigureWeightSync(const WeightSyncSpec& given, absl::Time deadline) {
  // NCCL and CUDA IPC run on this worker's own device.
  WeightSyncSpec spec = given;
  if (!impl_->options.device.empty() && impl_->options.device != "cpu") spec.set_device(impl_->options.device);
  std::unique_ptr<weight_sync::WeightReceiver> receiver;
  std::vector<std::unique_ptr<weight_sync::WeightReceiver>> pieces;
  const int tp = impl_->options.tensor_parallel;
  if (spec.pieces() > 1) {
    RLMESH_RETURN_IF_ERROR(weight_sync::ValidateSpec(spec));
    if (spec.pieces() % tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat("spec.pieces: ", spec.pieces(),
                                                     " is not a multiple of this worker's tensor_parallel=", tp));
    }
    for (int c = 0; c < spec.pieces(); ++c) {
      RLMESH_ASSIGN_OR_RETURN(auto r, CreateWeightReceiver(weight_sync::PieceSpec(spec, c)));
      pieces.push_back(std::move(r));
    }
  } else {
    RLMESH_ASSIGN_OR_RETURN(receiver, CreateWeightReceiver(spec));
  }
  RLMESH_ASSIGN_OR_RETURN(LoadTurn load_lock, LoadTurn::Take(&impl_->load_mu, deadline));
  impl_->load_mu.AssertHeld();
  const WeightSyncBackend backend = receiver ? receiver->backend() : pieces[0]->backend();
  impl_->receiver = std::move(receiver);
  impl_->piece_receivers = std::move(pieces);
  impl_->sync_group = spec.group_name();
  impl_->staging.clear();
  RLMESH_LOG(INFO) << "weight sync configured backend=" << WeightSyncBackend_Name(backend)
                   << " group=" << spec.group_name() << " rank=" << spec.rank()
                   << " pieces=" << std::max(spec.pieces(), 1);
  return absl::OkStatus();
}

std::string RolloutWorker::WeightDtype() const {
  const std::string& d = impl_->options.dtype;
  return d == "bf16" ? "bf16" : d == "fp16" ? "f16" : "f32";
}

absl::StatusOr<std::vector<NamedTensors>> RolloutWorker::Impl::ReceivePieces(
    int64_t version, const std::map<std::string, ParamInfo>& shapes) {
  const int tp = options.tensor_parallel;
  // The threads below use the receivers while this thread holds load_mu,
  // which keeps them from being replaced until the threads are joined.
  std::vector<weight_sync::WeightReceiver*> receivers;
  for (const auto& receiver : piece_receivers) receivers.push_back(receiver.get());
  const int pieces = static_cast<int>(receivers.size());
  const int per_rank = pieces / tp;
  // Rank r's pieces arrive on a thread of their own, in order: a collective
  // backend's publishers (one per piece, on several learner ranks) send at
  // the same time.
  std::vector<std::vector<NamedTensors>> got(tp);
  std::vector<absl::Status> status(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      for (int c = r * per_rank; c < (r + 1) * per_rank; ++c) {
        WeightLayout expected;
        expected.set_version(version);
        auto t = receivers[c]->Receive(expected);
        if (!t.ok()) {
          // The sync has failed: this rank's later pieces are not waited
          // for (a timeout each would hold the load turn that much longer).
          // A collective receiver drains what arrived for its own piece;
          // a publisher left waiting fails by its own timeout.
          status[r] = absl::Status(t.status().code(), absl::StrCat("piece ", c, ": ", t.status().message()));
          break;
        }
        got[r].push_back(*std::move(t));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) RLMESH_RETURN_IF_ERROR(s);
  // Each rank's pieces side by side, checked as its slice before anything
  // reaches the model.
  std::vector<NamedTensors> slices(tp);
  for (int r = 0; r < tp; ++r) {
    const NamedTensors& first = got[r][0];
    for (size_t i = 0; i < first.size(); ++i) {
      const std::string& name = first[i].first;
      std::vector<at::Tensor> parts;
      for (const NamedTensors& piece : got[r]) {
        if (piece.size() != first.size() || piece[i].first != name) {
          return absl::InvalidArgumentError(
              absl::StrCat("sync: the pieces of rank ", r, " do not list the same parameters (", name, ")"));
        }
        parts.push_back(piece[i].second);
      }
      slices[r].emplace_back(name, parallel::JoinTensorParallelPieces(name, parts));
    }
    RLMESH_RETURN_IF_ERROR(CheckAgainstModel(slices[r], shapes, tp));
  }
  return slices;
}

absl::Status RolloutWorker::Impl::CheckAgainstModel(const NamedTensors& tensors,
                                                    const std::map<std::string, ParamInfo>& params, int tp) {
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    auto it = params.find(name);
    if (it == params.end()) {
      return absl::InvalidArgumentError(absl::StrCat("sync.tensors[", name, "]: not a parameter of the model"));
    }
    std::vector<int64_t> want = it->second.shape;
    const int dim = tp > 1 ? parallel::TensorParallelSplitDim(name) : -1;
    if (dim >= 0 && dim < static_cast<int>(want.size())) want[dim] /= tp;
    if (t.scalar_type() != it->second.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sync.tensors[", name, "].dtype: ", c10::toString(t.scalar_type()), " but this worker's model holds ",
          c10::toString(it->second.dtype), " (its --dtype); the publisher must send that (WeightSyncSpec.dtype)"));
    }
    if (t.sizes().vec() != want) {
      return absl::InvalidArgumentError(absl::StrCat("sync.tensors[", name, "].shape: ", c10::str(t.sizes()),
                                                     " does not match the model's ", c10::str(want),
                                                     tp > 1 ? absl::StrCat(" (a slice of ", tp, ")") : ""));
    }
    seen.insert(name);
  }
  for (const auto& [name, info] : params) {
    if (!seen.count(name)) return absl::InvalidArgumentError(absl::StrCat("sync.tensors: missing ", name));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> RolloutWorker::LoadFromSync(const WeightLayout& layout, int64_t version,
                                                       absl::Time deadline) {
  const absl::Time start = absl::Now();
  RLMESH_ASSIGN_OR_RETURN(LoadTurn load_lock, LoadTurn::Take(&impl_->load_mu, deadline));
  impl_->load_mu.AssertHeld();
  if (!impl_->receiver && impl_->piece_receivers.empty()) {
    return absl::FailedPreconditionError("weight sync is not configured: call ConfigureWeightSync first");
  }
  WeightLayout expected = layout;
  if (expected.version() == 0) expected.set_version(version);
  if (expected.version() <= 0) return absl::InvalidArgumentError("sync.version: must be > 0 (or set version)");
  if (!impl_->piece_receivers.empty()) return LoadPiecesFromSync(expected, version, start);
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
  // A LoRA stage's learner sends only its adapters (learner::Trainer::
  // SyncTensors), which replace this worker's on the base it holds.
  bool adapters = !tensors.empty();
  for (const auto& [name, t] : tensors) adapters = adapters && actor::IsAdapterTensorName(name);
  int64_t bytes = 0;
  {
    absl::MutexLock lock(&impl_->mu);
    RLMESH_RETURN_IF_ERROR(impl_->CheckVersion(v));
    if (!impl_->config) {
      return absl::FailedPreconditionError("no model loaded: LoadWeights(checkpoint_path) once before a sync");
    }
    if (adapters) {
      RLMESH_RETURN_IF_ERROR(Impl::CheckAdapters(tensors, impl_->params, impl_->options.tensor_parallel));
    } else {
      RLMESH_RETURN_IF_ERROR(Impl::CheckAgainstModel(tensors, impl_->params, 1));
    }
  }
  for (const auto& [name, t] : tensors) bytes += static_cast<int64_t>(t.nbytes());
  auto u = std::make_shared<Impl::Update>();
  u->version = v;
  u->model_id = absl::StrCat("weight_sync:", impl_->sync_group.empty() ? "default" : impl_->sync_group);
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
    // At the fence the ranks are idle: each copies its slice in place.
    u->apply = impl_->ApplyToRanks(config, [staged](TensorParallelEngine& engine) { return engine.Load(*staged); });
  } else if (adapters) {
    u->apply = impl_->ApplyAdapters(staged);
  } else {
    u->apply = impl_->ApplyToModel(staged);
  }
  return impl_->FinishSync(std::move(u), bytes, start);
}

absl::StatusOr<LoadResult> RolloutWorker::LoadPiecesFromSync(const WeightLayout& expected, int64_t version,
                                                             absl::Time start) {
  impl_->load_mu.AssertHeld();  // LoadFromSync's turn
  // Receive first, whatever the state (see LoadFromSync).
  std::map<std::string, Impl::ParamInfo> shapes;
  {
    absl::MutexLock lock(&impl_->mu);
    shapes = impl_->params;
  }
  absl::StatusOr<std::vector<NamedTensors>> slices = impl_->ReceivePieces(expected.version(), shapes);
  if (shapes.empty()) {
    return absl::FailedPreconditionError("no model loaded: LoadWeights(checkpoint_path) once before a sync");
  }
  if (expected.tensors_size() > 0) {
    return absl::InvalidArgumentError(
        "sync.tensors: a sync in pieces checks each piece against the model's shapes; send only the version");
  }
  if (!slices.ok()) return slices.status();
  const int64_t v = version != 0 ? version : expected.version();
  int64_t bytes = 0;
  actor::ModelConfig config;
  {
    absl::MutexLock lock(&impl_->mu);
    RLMESH_RETURN_IF_ERROR(impl_->CheckVersion(v));
    if (!impl_->config) {
      return absl::FailedPreconditionError("no model loaded: LoadWeights(checkpoint_path) once before a sync");
    }
    config = *impl_->config;
  }
  for (const NamedTensors& slice : *slices) {
    for (const auto& [name, t] : slice) bytes += static_cast<int64_t>(t.nbytes());
  }
  auto u = std::make_shared<Impl::Update>();
  u->version = v;
  u->model_id = absl::StrCat("weight_sync:", impl_->sync_group.empty() ? "default" : impl_->sync_group);
  auto staged = std::make_shared<std::vector<NamedTensors>>(*std::move(slices));
  if (impl_->options.tensor_parallel > 1) {
    u->apply = impl_->ApplyToRanks(config,
                                   [staged](TensorParallelEngine& engine) { return engine.LoadSlices(*staged); });
  } else {
    u->apply = impl_->ApplyToModel(std::make_shared<NamedTensors>(std::move(staged->front())));
  }
  return impl_->FinishSync(std::move(u), bytes, start);
}

std::function<absl::Status()> RolloutWorker::Impl::ApplyToRanks(
    const actor::ModelConfig& config, std::function<absl::Status(TensorParallelEngine&)> load) {
  // A broken engine (a failed collective) is replaced by a new one.
  return [this, config, load = std::move(load)]() -> absl::Status {
    TensorParallelEngine* engine = tp_engine();
    if (engine != nullptr && engine->broken().ok()) return load(*engine);
    gen.reset();
    RLMESH_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelEngine> fresh, MakeTensorParallel(config));
    RLMESH_RETURN_IF_ERROR(load(*fresh));
    gen = std::move(fresh);
    return absl::OkStatus();
  };
}

absl::Status RolloutWorker::Impl::CheckAdapters(const NamedTensors& tensors,
                                                const std::map<std::string, ParamInfo>& params, int tp) {
  if (tp > 1) {
    return absl::InvalidArgumentError(absl::StrCat("sync: LoRA adapters for a worker with tensor_parallel=", tp,
                                                   " (its ranks carry no adapters; model.lora refuses rollout.tp)"));
  }
  for (const auto& [name, t] : tensors) {
    RLMESH_ASSIGN_OR_RETURN(const std::string module, actor::AdapterModule(name));
    auto it = params.find(module + ".weight");
    if (it == params.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sync.tensors[", name, "]: ", module, " is not a linear layer of the model"));
    }
    if (t.scalar_type() != it->second.dtype) {
      return absl::InvalidArgumentError(absl::StrCat("sync.tensors[", name, "].dtype: ", c10::toString(t.scalar_type()),
                                                     " but this worker's model holds ",
                                                     c10::toString(it->second.dtype)));
    }
  }
  return absl::OkStatus();
}

std::function<absl::Status()> RolloutWorker::Impl::ApplyAdapters(std::shared_ptr<const NamedTensors> tensors) {
  // The shapes against each layer are checked by SetAdapters before it
  // changes anything; the generator is rebuilt after the fence either way.
  return [this, tensors = std::move(tensors)]() -> absl::Status {
    actor::Transformer policy(model);
    return actor::SetAdapters(policy, *tensors, /*scaling=*/1.0);
  };
}

std::function<absl::Status()> RolloutWorker::Impl::ApplyToModel(std::shared_ptr<const NamedTensors> tensors) {
  return [this, tensors = std::move(tensors)]() -> absl::Status {
    at::NoGradGuard no_grad;
    // The whole policy: any adapter of an earlier LoRA sync goes.
    actor::Transformer policy(model);
    actor::DropLora(policy);
    std::map<std::string, at::Tensor> params;
    for (auto& [name, p] : model->NamedParameters()) params[name] = p;
    for (auto& [name, t] : *tensors) {
      at::Tensor& p = params.at(name);
      // Released by Sleep: storage of the model's shape again (checked
      // against `params` before the fence).
      if (p.sizes() != t.sizes()) p.set_(at::empty(t.sizes(), p.options()));
      p.copy_(t);
    }
    return absl::OkStatus();
  };
}

std::function<absl::Status()> RolloutWorker::Impl::ApplySleep(bool weights, std::shared_ptr<int64_t> released) {
  return [this, weights, released]() -> absl::Status {
    {
      absl::MutexLock lock(&mu);
      if (!pending.empty() || !inflight.empty() || !episode_groups.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("Sleep: ", pending.size(), " request(s) queued and ", inflight.size() + episode_groups.size(),
                         " group(s) generating; the worker sleeps only while idle"));
      }
      // From here requests are refused (Validate), before the fence says so.
      if (weights) weights_released = true;
    }
    // One model: the fence dropped the generator (and its KV cache)
    // already. Tensor-parallel ranks hold the weights: they go with them;
    // their caches are freed whenever a batch drains.
    if (TensorParallelEngine* engine = weights ? tp_engine() : nullptr) {
      for (int r = 0; r < engine->tp(); ++r) *released += engine->ParameterBytes(r);
    }
    if (weights) gen.reset();
    if (weights && model) {
      at::NoGradGuard no_grad;
      for (auto& [name, p] : model->NamedParameters()) {
        if (p.numel() == 0) continue;  // released before
        *released += static_cast<int64_t>(p.nbytes());
        p.set_(at::empty({0}, p.options()));
      }
    }
    return absl::OkStatus();
  };
}

absl::StatusOr<SleepResult> RolloutWorker::Sleep(bool release_weights, absl::Time deadline) {
  const absl::Time start = absl::Now();
  RLMESH_ASSIGN_OR_RETURN(c10::Device device, dist::ParseDevice(impl_->options.device, "device"));
  RLMESH_ASSIGN_OR_RETURN(LoadTurn load_lock, LoadTurn::Take(&impl_->load_mu, deadline));
  impl_->load_mu.AssertHeld();
  SleepResult r;
  r.memory_before = dist::ProcessMemoryBytes(device);
  auto released = std::make_shared<int64_t>(0);
  auto u = std::make_shared<Impl::Update>();
  {
    absl::MutexLock lock(&impl_->mu);
    if (!impl_->config) return absl::FailedPreconditionError("Sleep: no weights loaded");
    u->version = impl_->version;
    u->model_id = impl_->model_id;
    u->releases_weights = release_weights || impl_->weights_released;
  }
  u->apply = impl_->ApplySleep(release_weights, released);
  RLMESH_RETURN_IF_ERROR(impl_->PostUpdate(u));
  if (release_weights) {
    for (const auto& [name, t] : impl_->staging) *released += static_cast<int64_t>(t.nbytes());
    impl_->staging.clear();
  }
  dist::ReleaseCachedMemory(device);
  r.released_bytes = *released;
  r.memory_after = dist::ProcessMemoryBytes(device);
  r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  RLMESH_LOG(INFO) << "sleep release_weights=" << release_weights << " released_bytes=" << r.released_bytes
                   << " memory_before=" << r.memory_before << " memory_after=" << r.memory_after;
  return r;
}

absl::StatusOr<LoadResult> RolloutWorker::Impl::FinishSync(std::shared_ptr<Update> u, int64_t bytes,
                                                           absl::Time start) {
  const int64_t v = u->version;
  RLMESH_RETURN_IF_ERROR(PostUpdate(std::move(u)));
  RLMESH_LOG(INFO) << "received weights version=" << v << " bytes=" << bytes << " dtype=" << options.dtype
                   << " tensor_parallel=" << options.tensor_parallel
                   << " pieces=" << std::max<size_t>(piece_receivers.size(), 1);
  return LoadResult{v, bytes, absl::ToDoubleSeconds(absl::Now() - start)};
}

absl::StatusOr<std::unique_ptr<TensorParallelEngine>> RolloutWorker::Impl::MakeTensorParallel(
    const actor::ModelConfig& config) {
  TensorParallelEngineOptions o;
  o.tp = options.tensor_parallel;
  o.generator.max_batch = options.max_batch;
  o.generator.max_prefill_tokens = options.max_prefill_tokens;
  absl::StatusOr<std::unique_ptr<TensorParallelEngine>> engine = TensorParallelEngine::Create(config, o);
  if (!engine.ok()) {
    return absl::Status(engine.status().code(),
                        absl::StrCat("tensor_parallel=", o.tp, ": ", engine.status().message()));
  }
  return engine;
}

}  // namespace rlmesh::rollout
