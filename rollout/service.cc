#include "rollout/service.h"

#include <deque>
#include <memory>

#include "common/grpc_status.h"
#include "common/rpc_handler.h"
#include "common/status_macros.h"
#include "dist/device.h"

namespace rlmesh::rollout {
namespace {

// The call's deadline; none (the client set no deadline) is infinite.
absl::Time DeadlineOf(const grpc::CallbackServerContext& ctx) {
  if (ctx.deadline() == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(ctx.deadline());
}


// State shared by the reactor and the worker's callbacks. Every StartWrite /
// Finish happens under `mu`; OnDone clears `reactor` under `mu`, so a late
// callback never touches a deleted reactor.
class GenerateReactor;
struct StreamState {
  absl::Mutex mu;
  GenerateReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  std::deque<GenerateResponse> queue ABSL_GUARDED_BY(mu);  // front is being written when `writing`
  bool writing ABSL_GUARDED_BY(mu) = false;
  bool finish_pending ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;
  grpc::Status final_status ABSL_GUARDED_BY(mu);
};

class GenerateReactor final : public grpc::ServerWriteReactor<GenerateResponse> {
 public:
  GenerateReactor(RolloutWorker* worker, const GenerateRequest& request) : worker_(worker) {
    state_ = std::make_shared<StreamState>();
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = this;
    }
    std::shared_ptr<StreamState> st = state_;
    auto handle = worker_->Submit(
        request,
        [st](TrajectoryGroup group, bool stored) {
          GenerateResponse r;
          *r.mutable_group() = std::move(group);
          r.set_stored(stored);
          absl::MutexLock lock(&st->mu);
          if (st->finished || st->reactor == nullptr) return;
          st->queue.push_back(std::move(r));
          if (!st->writing) {
            st->writing = true;
            st->reactor->StartWrite(&st->queue.front());
          }
        },
        [st](absl::Status status) {
          absl::MutexLock lock(&st->mu);
          st->final_status = ToGrpcStatus(status);
          st->finish_pending = true;
          MaybeFinish(*st);
        });
    if (!handle.ok()) {
      absl::MutexLock lock(&state_->mu);
      state_->final_status = ToGrpcStatus(handle.status());
      state_->finish_pending = true;
      MaybeFinish(*state_);
      return;
    }
    absl::MutexLock lock(&state_->mu);
    handle_ = *handle;
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&state_->mu);
    state_->writing = false;
    if (!state_->queue.empty()) state_->queue.pop_front();
    if (!ok) {
      // The client went away: drop what is queued; OnCancel cancels the work.
      state_->queue.clear();
      if (!state_->finished) {
        state_->finished = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed"));
      }
      return;
    }
    if (!state_->queue.empty()) {
      state_->writing = true;
      StartWrite(&state_->queue.front());
      return;
    }
    MaybeFinish(*state_);
  }

  void OnCancel() override {
    std::shared_ptr<RequestHandle> h;
    {
      absl::MutexLock lock(&state_->mu);
      h = handle_;
    }
    worker_->Cancel(h);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
    }
    delete this;
  }

 private:
  static void MaybeFinish(StreamState& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) {
    if (st.finished || !st.finish_pending || st.writing || st.reactor == nullptr) return;
    st.finished = true;
    st.reactor->Finish(st.final_status);
  }

  RolloutWorker* const worker_;
  std::shared_ptr<StreamState> state_;
  std::shared_ptr<RequestHandle> handle_;  // guarded by state_->mu
};

}  // namespace

RolloutServiceImpl::~RolloutServiceImpl() {
  std::list<std::pair<std::thread, std::shared_ptr<bool>>> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.first.join();
}

grpc::ServerWriteReactor<GenerateResponse>* RolloutServiceImpl::Generate(grpc::CallbackServerContext* ctx,
                                                                         const GenerateRequest* request) {
  absl::Status s = auth_->Check(*ctx);
  if (!s.ok()) return new FailedWriteReactor<GenerateResponse>(s);
  return new GenerateReactor(worker_, *request);
}

grpc::ServerUnaryReactor* RolloutServiceImpl::LoadWeights(grpc::CallbackServerContext* ctx,
                                                          const LoadWeightsRequest* request,
                                                          LoadWeightsResponse* response) {
  absl::Status valid;
  if (request->source_case() == LoadWeightsRequest::SOURCE_NOT_SET) {
    valid = absl::InvalidArgumentError("source: set checkpoint_path or sync");
  } else if (request->version() < 0) {
    valid = absl::InvalidArgumentError("version: must be >= 0");
  }
  // The load waits for the fence (possibly seconds).
  return OffThread(ctx, valid, [this, request, response](absl::Time deadline) -> absl::Status {
    absl::StatusOr<LoadResult> r =
        request->has_sync() ? worker_->LoadFromSync(request->sync(), request->version(), deadline)
                            : worker_->LoadCheckpoint(request->checkpoint_path(), request->version(), deadline);
    if (!r.ok()) return r.status();
    response->set_version(r->version);
    response->set_bytes(r->bytes);
    response->set_seconds(r->seconds);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* RolloutServiceImpl::OffThread(grpc::CallbackServerContext* ctx, absl::Status valid,
                                                        std::function<absl::Status(absl::Time)> work) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = auth_->Check(*ctx);
  if (s.ok()) s = valid;
  if (!s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  const absl::Time deadline = DeadlineOf(*ctx);
  absl::MutexLock lock(&mu_);
  // Join the threads that already ended, so the list stays short.
  for (auto it = threads_.begin(); it != threads_.end();) {
    bool ended;
    {
      absl::MutexLock done_lock(&done_mu_);
      ended = *it->second;
    }
    if (ended) {
      it->first.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
  auto ended = std::make_shared<bool>(false);
  std::thread t([this, reactor, work = std::move(work), deadline, ended] {
    absl::Status st;
    try {
      st = work(deadline);
    } catch (const std::exception& e) {
      st = dist::ExceptionStatus(e, absl::StatusCode::kInternal, "unexpected exception");
    }
    reactor->Finish(ToGrpcStatus(st));
    absl::MutexLock done_lock(&done_mu_);
    *ended = true;
  });
  threads_.emplace_back(std::move(t), std::move(ended));
  return reactor;
}

grpc::ServerUnaryReactor* RolloutServiceImpl::ConfigureWeightSync(grpc::CallbackServerContext* ctx,
                                                                  const ConfigureWeightSyncRequest* request,
                                                                  ConfigureWeightSyncResponse* response) {
  // Joining a group may connect to its store and must wait for a load in
  // progress: off the callback thread, bounded by the call's deadline, so a
  // stuck sync never ties up the threads GetStatus and Generate need.
  return OffThread(ctx, absl::OkStatus(), [this, request, response](absl::Time deadline) {
    RLMESH_RETURN_IF_ERROR(worker_->ConfigureWeightSync(request->spec(), deadline));
    response->set_dtype(worker_->WeightDtype());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* RolloutServiceImpl::GetStatus(grpc::CallbackServerContext* ctx,
                                                        const RolloutStatusRequest*, RolloutStatus* response) {
  return HandleUnary(ctx, *auth_, [&] {
    *response = worker_->Status();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* RolloutServiceImpl::Sleep(grpc::CallbackServerContext* ctx, const SleepRequest* request,
                                                    SleepResponse* response) {
  return OffThread(ctx, absl::OkStatus(), [this, request, response](absl::Time deadline) -> absl::Status {
    absl::StatusOr<SleepResult> r = worker_->Sleep(request->release_weights(), deadline);
    if (!r.ok()) return r.status();
    response->set_released_bytes(r->released_bytes);
    response->set_memory_before_bytes(r->memory_before);
    response->set_memory_after_bytes(r->memory_after);
    response->set_seconds(r->seconds);
    return absl::OkStatus();
  });
}

}  // namespace rlmesh::rollout
