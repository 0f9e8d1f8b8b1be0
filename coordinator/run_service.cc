// RunService: gRPC glue over Coordinator's run calls.
#include <deque>

#include "absl/synchronization/mutex.h"
#include "coordinator/services.h"

namespace dt {
namespace {

// Streams a run's events. Coordinator callbacks may arrive on any thread and after the call has
// ended, so they go through a shared channel that the reactor detaches from in OnDone.
class WatchReactor : public grpc::ServerWriteReactor<v1::RunEvent> {
 public:
  // Metric events beyond this many queued for a slow reader are dropped (snapshots never are).
  static constexpr size_t kMaxQueued = 10'000;

  WatchReactor(const ServiceDeps& deps, std::string run_id)
      : deps_(deps), timer_(deps, "WatchRun"), run_id_(std::move(run_id)), channel_(std::make_shared<Channel>()) {
    channel_->reactor = this;
  }

  void Start(bool include_metrics) {
    std::weak_ptr<Channel> weak = channel_;
    absl::StatusOr<uint64_t> id =
        deps_.coordinator->Watch(run_id_, include_metrics, [weak](const Coordinator::WatchUpdate& update) {
          if (auto ch = weak.lock()) Push(*ch, update);
        });
    if (!id.ok()) {
      FinishOnce(ToGrpcStatus(id.status()));
      return;
    }
    absl::MutexLock lock(&channel_->mu);
    watch_id_ = *id;
  }

  void Fail(const absl::Status& status) { FinishOnce(ToGrpcStatus(status)); }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&channel_->mu);
    channel_->queue.pop_front();
    channel_->writing = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away"));
      return;
    }
    Pump(*channel_);
  }

  void OnCancel() override {
    deps_.coordinator->Unwatch(run_id_, watch_id());
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher cancelled"));
  }

  void OnDone() override {
    deps_.coordinator->Unwatch(run_id_, watch_id());
    {
      absl::MutexLock lock(&channel_->mu);
      channel_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct Channel {
    absl::Mutex mu;
    WatchReactor* reactor = nullptr;
    std::deque<v1::RunEvent> queue;
    bool writing = false;
    bool done = false;
    bool finished = false;
    absl::Status end;
    uint64_t revision = 0;  // of the newest snapshot queued
  };

  uint64_t watch_id() {
    absl::MutexLock lock(&channel_->mu);
    return watch_id_;
  }

  static void Push(Channel& ch, const Coordinator::WatchUpdate& update) {
    absl::MutexLock lock(&ch.mu);
    if (ch.reactor == nullptr || ch.finished) return;
    if (update.event) {
      bool metric = update.event->has_metric();
      if (!metric) {
        // Events may overtake each other on their way here: never show an older state.
        if (update.event->snapshot().revision() < ch.revision) return;
        ch.revision = update.event->snapshot().revision();
      }
      if (!metric || ch.queue.size() < kMaxQueued) ch.queue.push_back(*update.event);
    }
    if (update.done) {
      ch.done = true;
      ch.end = update.end;
    }
    ch.reactor->Pump(ch);
  }

  // Starts the next write, or finishes once everything is written after the last update.
  void Pump(Channel& ch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ch.mu) {
    if (ch.finished || ch.writing) return;
    if (!ch.queue.empty()) {
      ch.writing = true;
      StartWrite(&ch.queue.front());
      return;
    }
    if (!ch.done) return;
    channel_->mu.AssertHeld();  // `ch` is *channel_: tells the analysis so
    FinishLocked(ToGrpcStatus(ch.end));
  }

  void FinishOnce(grpc::Status status) {
    absl::MutexLock lock(&channel_->mu);
    FinishLocked(std::move(status));
  }

  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(channel_->mu) {
    if (channel_->finished) return;
    channel_->finished = true;
    timer_.Done(static_cast<absl::StatusCode>(status.error_code()));
    Finish(std::move(status));
  }

  ServiceDeps deps_;
  RpcTimer timer_;
  std::string run_id_;
  std::shared_ptr<Channel> channel_;
  uint64_t watch_id_ = 0;
};

}  // namespace

grpc::ServerUnaryReactor* RunServiceImpl::SubmitRun(grpc::CallbackServerContext* ctx, const v1::SubmitRunRequest* req,
                                                    v1::SubmitRunResponse* out) {
  return ReplyForAdmin(deps_, ctx, "SubmitRun", out, [&] { return deps_.coordinator->SubmitRun(req->spec()); });
}

grpc::ServerUnaryReactor* RunServiceImpl::GetRun(grpc::CallbackServerContext* ctx, const v1::GetRunRequest* req,
                                                 v1::Run* out) {
  return ReplyForRun(deps_, ctx, "GetRun", req->run_id(), out,
                     [&] { return deps_.coordinator->GetRun(req->run_id()); });
}

grpc::ServerUnaryReactor* RunServiceImpl::ListRuns(grpc::CallbackServerContext* ctx, const v1::ListRunsRequest* req,
                                                   v1::ListRunsResponse* out) {
  return ReplyForAdmin(deps_, ctx, "ListRuns", out, [&]() -> absl::StatusOr<v1::ListRunsResponse> {
    std::vector<v1::RunState> states;
    for (int s : req->states()) states.push_back(static_cast<v1::RunState>(s));
    absl::StatusOr<Coordinator::RunPage> page = deps_.coordinator->ListRuns(req->limit(), states, req->page_token());
    if (!page.ok()) return page.status();
    v1::ListRunsResponse response;
    for (auto& r : page->runs) *response.add_runs() = std::move(r);
    response.set_next_page_token(page->next_page_token);
    return response;
  });
}

grpc::ServerUnaryReactor* RunServiceImpl::CancelRun(grpc::CallbackServerContext* ctx, const v1::CancelRunRequest* req,
                                                    v1::Run* out) {
  return ReplyForAdmin(deps_, ctx, "CancelRun", out,
                       [&] { return deps_.coordinator->CancelRun(req->run_id(), req->reason()); });
}

grpc::ServerUnaryReactor* RunServiceImpl::AttachLaunch(grpc::CallbackServerContext* ctx,
                                                       const v1::AttachLaunchRequest* req, v1::Run* out) {
  return ReplyForRun(deps_, ctx, "AttachLaunch", req->run_id(), out,
                     [&] { return deps_.coordinator->AttachLaunch(*req); });
}

grpc::ServerUnaryReactor* RunServiceImpl::ExcludeNodes(grpc::CallbackServerContext* ctx,
                                                       const v1::ExcludeNodesRequest* req, v1::Run* out) {
  return ReplyForRun(deps_, ctx, "ExcludeNodes", req->run_id(), out,
                     [&] { return deps_.coordinator->ExcludeNodes(*req); });
}

grpc::ServerWriteReactor<v1::RunEvent>* RunServiceImpl::WatchRun(grpc::CallbackServerContext* ctx,
                                                                 const v1::WatchRunRequest* req) {
  auto* reactor = new WatchReactor(deps_, req->run_id());
  if (auto who = AuthorizeRun(deps_, ctx, req->run_id()); !who.ok()) {
    reactor->Fail(who.status());
  } else {
    reactor->Start(req->include_metrics());
  }
  return reactor;
}

}  // namespace dt
