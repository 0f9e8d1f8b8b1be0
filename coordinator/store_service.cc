// StoreService: the pipelined store session (the hot path of process-group set-up) and the
// unary forms of each operation.
#include <deque>
#include <functional>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "coordinator/services.h"
#include "coordinator/store_barriers.h"
#include "coordinator/store_ops.h"

namespace dt {
namespace {

// One client's stream. Requests are handled as they arrive; answers to blocking gets and waits
// are written when their keys appear, so responses may overtake each other (ids tell them apart).
// Pending callbacks can fire on any thread and after the stream ended: they reach the reactor
// through a shared state that OnDone detaches.
class SessionReactor : public grpc::ServerBidiReactor<v1::StoreRequest, v1::StoreResponse> {
 public:
  SessionReactor(const ServiceDeps& deps, const v1::StoreSessionFeatures* features,
                 std::shared_ptr<StoreServiceImpl::Sessions> sessions, grpc::CallbackServerContext* ctx)
      : deps_(deps),
        features_(features),
        timer_(deps, "StoreSession"),
        state_(std::make_shared<State>()),
        sessions_(std::move(sessions)) {
    state_->reactor = this;
    {
      absl::MutexLock lock(&sessions_->mu);
      session_id_ = sessions_->next_id++;
      sessions_->closers[session_id_] = [state = state_](const absl::Status& status) {
        absl::MutexLock lock(&state->mu);
        if (state->reactor == nullptr) return;
        state->reactor->state_->mu.AssertHeld();  // the same State: tells the analysis so
        state->reactor->FinishLocked(status);
      };
    }
    absl::StatusOr<Principal> who = deps_.auth->Authenticate(*ctx);
    if (!who.ok()) {
      FinishStream(who.status());
      return;
    }
    who_ = *who;
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&state_->mu);
      state_->reads_done = true;
      MaybeFinishLocked();
      return;
    }
    if (!store_) {
      if (absl::Status s = Open(); !s.ok()) {
        FinishStream(s);
        return;
      }
    } else {
      Handle();
    }
    request_.Clear();
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->finished) return;
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&state_->mu);
    state_->queue.pop_front();
    state_->writing = false;
    if (!ok) {
      FinishLocked(absl::CancelledError("the store client went away"));
      return;
    }
    PumpLocked();
  }

  void OnCancel() override {}

  void OnDone() override {
    {
      absl::MutexLock lock(&sessions_->mu);
      sessions_->closers.erase(session_id_);
    }
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct State {
    absl::Mutex mu;
    SessionReactor* reactor = nullptr;
    std::deque<v1::StoreResponse> queue;
    bool writing = false;
    bool reads_done = false;
    bool finished = false;
  };

  absl::Status Open() {
    if (!request_.has_open()) {
      return absl::InvalidArgumentError("the first request of a store session must be `open`");
    }
    const v1::StoreScope& scope = request_.open();
    if (absl::Status s = Coordinator::Authorize(who_, scope.run_id()); !s.ok()) return s;
    scope_ = scope;
    absl::StatusOr<std::shared_ptr<KvStore>> store = deps_.coordinator->store_barriers().OpenStore(scope);
    if (!store.ok()) return store.status();
    store_ = *store;
    v1::StoreResponse ok;
    ok.set_id(request_.id());
    *ok.mutable_features() = *features_;
    Send(state_, std::move(ok));
    return absl::OkStatus();
  }

  void Handle() {
    if (request_.has_barrier()) {
      HandleBarrier();
      return;
    }
    uint64_t id = request_.id();
    bool quiet_set = request_.has_set() && request_.set().answer_only_on_error();
    std::weak_ptr<State> weak = state_;
    Deferred deferred;
    ApplyStoreOp(
        *store_, *deps_.coordinator, request_,
        [weak, id, quiet_set](v1::StoreResponse r) {
          if (quiet_set && !r.has_status()) return;
          r.set_id(id);
          if (auto st = weak.lock()) Send(st, std::move(r));
        },
        deferred, *features_);
  }

  // The stream's rank arrives at a barrier; the release (or the failure) is written to the stream,
  // unless a node relay member: then nothing is.
  void HandleBarrier() {
    uint64_t id = request_.id();
    const v1::StoreBarrierRequest& b = request_.barrier();
    v1::BarrierRequest req;
    req.set_run_id(scope_.run_id());
    req.set_generation(scope_.generation());
    req.set_rank(scope_.rank());
    req.set_name(b.name());
    req.set_sequence(b.sequence());
    req.set_timeout_ms(b.timeout_ms());
    std::weak_ptr<State> weak = state_;
    auto answer_error = [weak, id](const absl::Status& s) {
      v1::StoreResponse out;
      out.set_id(id);
      *out.mutable_status() = ToStoreStatus(s);
      if (auto st = weak.lock()) Send(st, std::move(out));
    };
    if (b.relayed_ranks_size() > 0 && !b.relay_member()) {
      answer_error(absl::InvalidArgumentError("relayed_ranks come only with a relay_member arrival"));
      return;
    }
    if (b.relay_member()) {
      // Its node's first arrival learns the outcome, this one and publishes it (answering the
      // member too would cost the write the relay exists to save).
      deps_.coordinator->store_barriers().Barrier(
          req, MakePending<v1::BarrierResponse>([](absl::StatusOr<v1::BarrierResponse>) {}));
      if (b.relayed_ranks_size() > 0) {
        std::vector<int32_t> relayed(b.relayed_ranks().begin(), b.relayed_ranks().end());
        if (absl::Status s = deps_.coordinator->store_barriers().ArriveRelayed(req, relayed); !s.ok()) answer_error(s);
      }
      return;
    }
    deps_.coordinator->store_barriers().Barrier(
        req, MakePending<v1::BarrierResponse>([weak, id, answer_error](absl::StatusOr<v1::BarrierResponse> r) {
          if (!r.ok()) {
            answer_error(r.status());
            return;
          }
          v1::StoreResponse out;
          out.set_id(id);
          out.set_number(static_cast<int64_t>(r->sequence()));
          if (auto st = weak.lock()) Send(st, std::move(out));
        }));
  }

  static void Send(const std::shared_ptr<State>& st, v1::StoreResponse response) {
    absl::MutexLock lock(&st->mu);
    if (st->reactor == nullptr || st->finished) return;
    st->queue.push_back(std::move(response));
    st->reactor->state_->mu.AssertHeld();  // the same State: tells the analysis so
    st->reactor->PumpLocked();
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    if (state_->finished || state_->writing) return;
    if (state_->queue.empty()) {
      MaybeFinishLocked();
      return;
    }
    state_->writing = true;
    // More answers queued behind this one: let gRPC coalesce them into fewer writes.
    grpc::WriteOptions options;
    if (state_->queue.size() > 1) options.set_buffer_hint();
    StartWrite(&state_->queue.front(), options);
  }

  // The client closed its side: finish once every answer is written (parked calls are dropped:
  // nobody could read their answers).
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    if (state_->reads_done && !state_->writing && state_->queue.empty()) {
      FinishLocked(absl::OkStatus());
    }
  }

  void FinishStream(const absl::Status& s) {
    absl::MutexLock lock(&state_->mu);
    FinishLocked(s);
  }

  void FinishLocked(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    if (state_->finished) return;
    state_->finished = true;
    timer_.Done(s.code());
    Finish(ToGrpcStatus(s));
  }

  ServiceDeps deps_;
  const v1::StoreSessionFeatures* features_;  // the service's, which outlives its sessions
  RpcTimer timer_;
  std::shared_ptr<State> state_;
  std::shared_ptr<StoreServiceImpl::Sessions> sessions_;
  uint64_t session_id_ = 0;
  Principal who_;
  v1::StoreScope scope_;  // the open request's
  std::shared_ptr<KvStore> store_;
  v1::StoreRequest request_;
};

// A unary store RPC: its request as a session request, through ApplyStoreOp; `fill` turns a
// successful answer into the RPC's response.
template <typename Response>
grpc::ServerUnaryReactor* UnaryStoreOp(const ServiceDeps& deps, grpc::CallbackServerContext* ctx, const char* method,
                                       const v1::StoreScope& scope, v1::StoreRequest request, Response* out,
                                       void (*fill)(const v1::StoreResponse&, Response&)) {
  return WaitForRun(deps, ctx, method, scope.run_id(), out, [&](PendingUnaryReactor<Response>& reactor) {
    absl::StatusOr<std::shared_ptr<KvStore>> store = deps.coordinator->store_barriers().OpenStore(scope);
    if (!store.ok()) {
      reactor.pending()->Complete(store.status());
      return;
    }
    PendingPtr<Response> reply = reactor.pending();
    Deferred deferred;  // an answer known now is delivered before the call counts as waiting
    ApplyStoreOp(
        **store, *deps.coordinator, request,
        [reply, fill](v1::StoreResponse r) {
          if (r.has_status()) {
            reply->Complete(FromStoreStatus(r.status()));
            return;
          }
          Response response;
          fill(r, response);
          reply->Complete(std::move(response));
        },
        deferred);
  });
}

}  // namespace

grpc::ServerBidiReactor<v1::StoreRequest, v1::StoreResponse>* StoreServiceImpl::Session(
    grpc::CallbackServerContext* ctx) {
  return new SessionReactor(deps_, &features_, sessions_, ctx);
}

void StoreServiceImpl::CloseSessions(const absl::Status& status) {
  std::vector<std::function<void(const absl::Status&)>> closers;
  {
    absl::MutexLock lock(&sessions_->mu);
    for (auto& [id, close] : sessions_->closers) closers.push_back(close);
  }
  for (auto& close : closers) close(status);
}

grpc::ServerUnaryReactor* StoreServiceImpl::Set(grpc::CallbackServerContext* ctx, const v1::StoreSetRequest* req,
                                                v1::StoreSetResponse* out) {
  v1::StoreRequest r;
  *r.mutable_set() = *req;
  r.mutable_set()->set_answer_only_on_error(false);
  return UnaryStoreOp<v1::StoreSetResponse>(deps_, ctx, "StoreSet", req->scope(), std::move(r), out,
                                            [](const v1::StoreResponse&, v1::StoreSetResponse&) {});
}

grpc::ServerUnaryReactor* StoreServiceImpl::Get(grpc::CallbackServerContext* ctx, const v1::StoreGetRequest* req,
                                                v1::StoreGetResponse* out) {
  v1::StoreRequest r;
  *r.mutable_get() = *req;
  return UnaryStoreOp<v1::StoreGetResponse>(deps_, ctx, "StoreGet", req->scope(), std::move(r), out,
                                            [](const v1::StoreResponse& a, v1::StoreGetResponse& o) {
                                              o.set_value(a.value());
                                              o.set_present(a.flag());
                                            });
}

grpc::ServerUnaryReactor* StoreServiceImpl::Add(grpc::CallbackServerContext* ctx, const v1::StoreAddRequest* req,
                                                v1::StoreAddResponse* out) {
  v1::StoreRequest r;
  *r.mutable_add() = *req;
  return UnaryStoreOp<v1::StoreAddResponse>(
      deps_, ctx, "StoreAdd", req->scope(), std::move(r), out,
      [](const v1::StoreResponse& a, v1::StoreAddResponse& o) { o.set_value(a.number()); });
}

grpc::ServerUnaryReactor* StoreServiceImpl::CompareSet(grpc::CallbackServerContext* ctx,
                                                       const v1::StoreCompareSetRequest* req,
                                                       v1::StoreCompareSetResponse* out) {
  v1::StoreRequest r;
  *r.mutable_compare_set() = *req;
  return UnaryStoreOp<v1::StoreCompareSetResponse>(
      deps_, ctx, "StoreCompareSet", req->scope(), std::move(r), out,
      [](const v1::StoreResponse& a, v1::StoreCompareSetResponse& o) { o.set_value(a.value()); });
}

grpc::ServerUnaryReactor* StoreServiceImpl::Check(grpc::CallbackServerContext* ctx, const v1::StoreCheckRequest* req,
                                                  v1::StoreCheckResponse* out) {
  v1::StoreRequest r;
  *r.mutable_check() = *req;
  return UnaryStoreOp<v1::StoreCheckResponse>(
      deps_, ctx, "StoreCheck", req->scope(), std::move(r), out,
      [](const v1::StoreResponse& a, v1::StoreCheckResponse& o) { o.set_all_exist(a.flag()); });
}

grpc::ServerUnaryReactor* StoreServiceImpl::Wait(grpc::CallbackServerContext* ctx, const v1::StoreWaitRequest* req,
                                                 v1::StoreWaitResponse* out) {
  v1::StoreRequest r;
  *r.mutable_wait() = *req;
  return UnaryStoreOp<v1::StoreWaitResponse>(deps_, ctx, "StoreWait", req->scope(), std::move(r), out,
                                             [](const v1::StoreResponse&, v1::StoreWaitResponse&) {});
}

grpc::ServerUnaryReactor* StoreServiceImpl::DeleteKey(grpc::CallbackServerContext* ctx,
                                                      const v1::StoreDeleteKeyRequest* req,
                                                      v1::StoreDeleteKeyResponse* out) {
  v1::StoreRequest r;
  *r.mutable_delete_key() = *req;
  return UnaryStoreOp<v1::StoreDeleteKeyResponse>(
      deps_, ctx, "StoreDeleteKey", req->scope(), std::move(r), out,
      [](const v1::StoreResponse& a, v1::StoreDeleteKeyResponse& o) { o.set_deleted(a.flag()); });
}

grpc::ServerUnaryReactor* StoreServiceImpl::NumKeys(grpc::CallbackServerContext* ctx,
                                                    const v1::StoreNumKeysRequest* req, v1::StoreNumKeysResponse* out) {
  v1::StoreRequest r;
  *r.mutable_num_keys() = *req;
  return UnaryStoreOp<v1::StoreNumKeysResponse>(
      deps_, ctx, "StoreNumKeys", req->scope(), std::move(r), out,
      [](const v1::StoreResponse& a, v1::StoreNumKeysResponse& o) { o.set_num_keys(a.number()); });
}

}  // namespace dt
