#include "replay_buffer/service.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc_handler.h"
#include "common/trace.h"

namespace rlmesh {

absl::Status ReplayServiceOptions::Validate() const {
  if (writer_threads <= 0) return absl::InvalidArgumentError("writer_threads must be > 0");
  if (reader_threads <= 0) return absl::InvalidArgumentError("reader_threads must be > 0");
  if (sampler_threads <= 0) return absl::InvalidArgumentError("sampler_threads must be > 0");
  if (max_sample_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("max_sample_wait is negative");
  }
  if (deadline_margin < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("deadline_margin is negative");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- service

ReplayBufferService::ReplayBufferService(ReplayStore* store, const ServerAuth* auth,
                                         const ReplayServiceOptions& options)
    : store_(store),
      auth_(auth),
      options_(options),
      writers_(options.writer_threads, "rb-write"),
      readers_(options.reader_threads, "rb-read"),
      samplers_(options.sampler_threads, "rb-sample") {}

ReplayBufferService::~ReplayBufferService() { Shutdown(); }

void ReplayBufferService::Shutdown() {
  store_->Shutdown();
  samplers_.Stop();
  writers_.Stop();
  readers_.Stop();
}

grpc::ServerUnaryReactor* ReplayBufferService::Run(grpc::CallbackServerContext* ctx,
                                                   ThreadPool& pool,
                                                   std::function<absl::Status()> fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status status = auth_->Check(*ctx);
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  const bool queued = pool.Schedule([reactor, fn = std::move(fn)] {
    absl::Status s;
    try {
      s = fn();
    } catch (const std::exception& e) {
      s = absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
    }
    reactor->Finish(ToGrpcStatus(s));
  });
  if (!queued) reactor->Finish(ToGrpcStatus(absl::UnavailableError("replay buffer is stopping")));
  return reactor;
}

grpc::ServerUnaryReactor* ReplayBufferService::PutGroups(grpc::CallbackServerContext* ctx,
                                                         const PutGroupsRequest* request,
                                                         PutGroupsResponse* response) {
  return Run(ctx, writers_, [this, request, response]() -> absl::Status {
    TraceSpan span("put_groups", "replay_buffer");
    absl::StatusOr<PutGroupsResponse> r = store_->PutGroups(*request);
    if (!r.ok()) return r.status();
    *response = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ReplayBufferService::SampleGroups(grpc::CallbackServerContext* ctx,
                                                            const SampleGroupsRequest* request,
                                                            SampleGroupsResponse* response) {
  // The call's deadline (minus a margin) bounds the wait, capped by
  // max_sample_wait when the client set none or a far one.
  const absl::Time now = absl::Now();
  absl::Time deadline = now + options_.max_sample_wait;
  const auto client_deadline = ctx->deadline();
  if (client_deadline != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(client_deadline) - options_.deadline_margin);
  }
  return Run(ctx, samplers_, [this, ctx, request, response, deadline]() -> absl::Status {
    TraceSpan span("sample_groups", "replay_buffer");
    absl::StatusOr<SampleGroupsResponse> r =
        store_->SampleGroups(*request, deadline, [ctx] { return ctx->IsCancelled(); });
    if (!r.ok()) return r.status();
    *response = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ReplayBufferService::AckSample(grpc::CallbackServerContext* ctx,
                                                         const AckSampleRequest* request,
                                                         AckSampleResponse*) {
  return Run(ctx, writers_, [this, request] { return store_->AckSample(*request); });
}

grpc::ServerUnaryReactor* ReplayBufferService::Query(grpc::CallbackServerContext* ctx,
                                                     const QueryRequest* request,
                                                     QueryResponse* response) {
  return Run(ctx, readers_, [this, request, response]() -> absl::Status {
    absl::StatusOr<QueryResponse> r = store_->Query(*request);
    if (!r.ok()) return r.status();
    *response = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ReplayBufferService::Stats(grpc::CallbackServerContext* ctx,
                                                     const StatsRequest* request,
                                                     StatsResponse* response) {
  // Stats reads only the in-memory catalog: answer inline.
  return HandleUnary(ctx, *auth_, [this, request, response]() -> absl::Status {
    absl::StatusOr<StatsResponse> r = store_->Stats(*request);
    if (!r.ok()) return r.status();
    *response = *std::move(r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ReplayBufferService::Trim(grpc::CallbackServerContext* ctx,
                                                    const TrimRequest* request,
                                                    TrimResponse* response) {
  return Run(ctx, writers_, [this, request, response]() -> absl::Status {
    absl::StatusOr<TrimResponse> r = store_->Trim(*request);
    if (!r.ok()) return r.status();
    *response = *std::move(r);
    return absl::OkStatus();
  });
}

namespace {

// Streams the chunks a worker thread produces; one write in flight at a time
// (the producer waits for OnWriteDone), so memory stays at one chunk.
class ExportReactor final : public grpc::ServerWriteReactor<ExportChunk> {
 public:
  ExportReactor(ReplayStore* store, ThreadPool* pool, const ExportRequest& request)
      : store_(store), request_(request) {
    if (!pool->Schedule([this] { Produce(); })) {
      Finish(ToGrpcStatus(absl::UnavailableError("replay buffer is stopping")));
    }
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  void OnDone() override { delete this; }

 private:
  void Produce() {
    absl::Status status;
    try {
      status = store_->Export(request_, [this](ExportChunk& chunk) {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return false;
        chunk_.Swap(&chunk);
        writing_ = true;
        StartWrite(&chunk_);
        mu_.Await(absl::Condition(this, &ExportReactor::WriteSettled));
        return !cancelled_;
      });
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
    }
    {
      // Finish only once no write is outstanding.
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ExportReactor::NotWriting));
    }
    Finish(ToGrpcStatus(status));  // last touch of `this` from this thread
  }
  bool WriteSettled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_ || cancelled_; }
  bool NotWriting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; }

  ReplayStore* const store_;
  const ExportRequest request_;
  absl::Mutex mu_;
  ExportChunk chunk_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerWriteReactor<ExportChunk>* ReplayBufferService::Export(
    grpc::CallbackServerContext* ctx, const ExportRequest* request) {
  absl::Status status = auth_->Check(*ctx);
  if (!status.ok()) return new FailedWriteReactor<ExportChunk>(status);
  return new ExportReactor(store_, &readers_, *request);
}

}  // namespace rlmesh
