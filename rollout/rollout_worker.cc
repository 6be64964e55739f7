#include "rollout/rollout_worker.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "actor/checkpoint.h"
#include "common/status_macros.h"
#include "rollout/worker_impl.h"

namespace rlmesh::rollout {

absl::Status RolloutWorkerOptions::Validate() const {
  if (name.empty()) return absl::InvalidArgumentError("name: must not be empty");
  if (max_queue < 0) return absl::InvalidArgumentError("max_queue: must be >= 0");
  if (max_batch <= 0) return absl::InvalidArgumentError("max_batch: must be > 0");
  if (max_prefill_tokens <= 0) return absl::InvalidArgumentError("max_prefill_tokens: must be > 0");
  if (pipeline_threads <= 0) return absl::InvalidArgumentError("pipeline_threads: must be > 0");
  if (environment_threads <= 0) return absl::InvalidArgumentError("environment_threads: must be > 0");
  if (rate_window <= absl::ZeroDuration()) return absl::InvalidArgumentError("rate_window: must be > 0");
  if (tensor_parallel < 1) return absl::InvalidArgumentError("tensor_parallel: must be >= 1");
  if (tensor_parallel > 1 && (device != "cpu" || dtype != "fp32")) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel: ", tensor_parallel,
                                                   " needs device \"cpu\" and dtype \"fp32\" (got \"", device,
                                                   "\", \"", dtype, "\"): the split model runs on the CPU only"));
  }
  if (cuda_graphs && (device.rfind("cuda", 0) != 0 || tensor_parallel != 1)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_graphs: needs a CUDA device and tensor_parallel 1 (got \"",
                                                   device, "\", ", tensor_parallel, ")"));
  }
  actor::LoadOptions lo;
  lo.dtype = dtype;
  lo.device = device;
  absl::Status s = lo.Validate();
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("dtype/device: ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<RolloutWorkerOptions::OnUpdate> ParseOnUpdate(const std::string& text) {
  if (text.empty() || text == "finish") return RolloutWorkerOptions::OnUpdate::kFinish;
  if (text == "abort") return RolloutWorkerOptions::OnUpdate::kAbort;
  if (text == "partial") return RolloutWorkerOptions::OnUpdate::kPartial;
  return absl::InvalidArgumentError(absl::StrCat("on_update: \"", text, "\" is not finish, abort or partial"));
}

RolloutWorker::RolloutWorker(RolloutWorkerOptions options, std::unique_ptr<actor::Tokenizer> tokenizer,
                             RewardClient* reward, ReplayBufferClient* replay, EnvironmentClient* environment)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(tokenizer), reward, replay, environment)) {
  impl_->engine = std::thread([this] { impl_->Loop(); });
}

RolloutWorker::~RolloutWorker() {
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stop = true;
    for (auto& r : impl_->pending) r->cancelled = true;
    for (auto& [id, e] : impl_->inflight) e.req->cancelled = true;
    for (auto& [key, g] : impl_->episode_groups) g->req->cancelled = true;
  }
  impl_->engine.join();
  // Environment calls still queued or running see `stop` and drop their
  // episodes (each call ends by its deadline); then the pipeline drains.
  impl_->env_pool.Stop();
  impl_->pipeline.Stop();
}

absl::StatusOr<std::shared_ptr<RequestHandle>> RolloutWorker::Submit(const GenerateRequest& request,
                                                                      GroupSink on_group, DoneCallback on_done) {
  auto req = std::make_shared<RequestHandle>();
  req->submitted_us = NowMicros();
  absl::MutexLock lock(&impl_->mu);
  if (impl_->stop) return absl::CancelledError("rollout worker shutting down");
  RLMESH_RETURN_IF_ERROR(impl_->Validate(request, &req->sampling));
  if (static_cast<int64_t>(impl_->pending.size()) >= impl_->options.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat("rollout worker queue is full (", impl_->pending.size(),
                                                     " requests waiting, max_queue ", impl_->options.max_queue,
                                                     "); retry later"));
  }
  req->id = impl_->next_request_id++;
  req->request = request;
  req->on_group = std::move(on_group);
  req->on_done = std::move(on_done);
  req->groups_left = request.prompts_size();
  impl_->pending.push_back(req);
  return req;
}

void RolloutWorker::Cancel(const std::shared_ptr<RequestHandle>& handle) {
  if (!handle) return;
  bool was_pending = false;
  {
    absl::MutexLock lock(&impl_->mu);
    handle->cancelled = true;
    auto it = std::find(impl_->pending.begin(), impl_->pending.end(), handle);
    if (it != impl_->pending.end()) {
      impl_->pending.erase(it);
      was_pending = true;
    }
  }
  if (was_pending) impl_->EndUndelivered(handle, absl::CancelledError("request cancelled"));
}

RolloutStatus RolloutWorker::Status() const {
  RolloutStatus s;
  absl::MutexLock lock(&impl_->mu);
  s.set_policy_version(impl_->version);
  s.set_active_sequences(impl_->active_sequences.load());
  s.set_queued_requests(static_cast<int32_t>(impl_->pending.size()));
  s.set_generated_tokens(impl_->generated_tokens);
  s.set_cuda_graph_captures(impl_->graph_captures);
  s.set_cuda_graph_replays(impl_->graph_replays);
  s.set_failed_groups(impl_->failed_groups);
  s.set_dropped_groups(impl_->dropped_groups);
  if (impl_->update) s.set_pending_update_version(impl_->update->version);
  for (int64_t b : impl_->rank_bytes) s.add_rank_parameter_bytes(b);
  s.set_weights_released(impl_->weights_released);
  if (!impl_->rate.empty()) {
    int64_t tokens = 0;
    for (const auto& [t, n] : impl_->rate) tokens += n;
    const double secs = std::max(1e-3, absl::ToDoubleSeconds(absl::Now() - impl_->rate.front().first));
    s.set_tokens_per_second(static_cast<double>(tokens) / secs);
  }
  return s;
}

int64_t RolloutWorker::policy_version() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->version;
}

bool RolloutWorker::WaitIdle(absl::Duration timeout) const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->mu.AwaitWithTimeout(absl::Condition(
                                        +[](Impl* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
                                          return s->pending.empty() && s->inflight.empty() && s->episode_groups.empty() &&
                                                 s->pipeline_busy == 0;
                                        },
                                        impl_.get()),
                                    timeout);
}

}  // namespace rlmesh::rollout
