// StoreService: the pipelined store session (the hot path of process-group set-up) and the
// unary forms of each operation.
#include <deque>

#include "absl/synchronization/mutex.h"
#include "coordinator/services.h"

namespace dt {
namespace {

v1::StoreStatus ToStoreStatus(const absl::Status& s) {
  v1::StoreStatus out;
  out.set_code(static_cast<int>(s.code()));
  out.set_message(std::string(s.message()));
  return out;
}

// One client's stream. Requests are handled as they arrive; answers to blocking gets and waits
// are written when their keys appear, so responses may overtake each other (ids tell them apart).
// Pending callbacks can fire on any thread and after the stream ended: they reach the reactor
// through a shared state that OnDone detaches.
class SessionReactor : public grpc::ServerBidiReactor<v1::StoreRequest, v1::StoreResponse> {
 public:
  SessionReactor(const ServiceDeps& deps, std::shared_ptr<StoreServiceImpl::Sessions> sessions,
                 grpc::CallbackServerContext* ctx)
      : deps_(deps), timer_(deps, "StoreSession"), state_(std::make_shared<State>()), sessions_(std::move(sessions)) {
    state_->reactor = this;
    {
      absl::MutexLock lock(&sessions_->mu);
      session_id_ = sessions_->next_id++;
      sessions_->closers[session_id_] = [state = state_](const absl::Status& status) {
        absl::MutexLock lock(&state->mu);
        if (state->reactor != nullptr) state->reactor->FinishLocked(status);
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
      state_->broken = true;
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
    bool broken = false;
    int outstanding = 0;  // parked gets and waits
  };

  absl::Status Open() {
    if (!request_.has_open()) {
      return absl::InvalidArgumentError("the first request of a store session must be `open`");
    }
    const v1::StoreScope& scope = request_.open();
    if (absl::Status s = Coordinator::Authorize(who_, scope.run_id()); !s.ok()) return s;
    absl::StatusOr<std::shared_ptr<KvStore>> store = deps_.coordinator->OpenStore(scope);
    if (!store.ok()) return store.status();
    store_ = *store;
    v1::StoreResponse ok;
    ok.set_id(request_.id());
    Send(state_, std::move(ok));
    return absl::OkStatus();
  }

  void Handle() {
    uint64_t id = request_.id();
    v1::StoreResponse out;
    out.set_id(id);
    absl::Status status;
    Deferred deferred;
    switch (request_.op_case()) {
      case v1::StoreRequest::kSet:
        status = store_->Set(request_.set().key(), std::move(*request_.mutable_set()->mutable_value()),
                             deferred);
        if (status.ok() && request_.set().answer_only_on_error()) return;
        break;
      case v1::StoreRequest::kGet: {
        absl::StatusOr<absl::Duration> timeout = deps_.coordinator->StoreTimeout(request_.get().timeout_ms());
        if (!timeout.ok()) {
          status = timeout.status();
          break;
        }
        Park();
        std::weak_ptr<State> weak = state_;
        store_->Get(request_.get().key(), *timeout,
                    MakePending<std::string>([weak, id](absl::StatusOr<std::string> v) {
                      v1::StoreResponse r;
                      r.set_id(id);
                      if (v.ok()) {
                        r.set_value(std::move(*v));
                      } else {
                        *r.mutable_status() = ToStoreStatus(v.status());
                      }
                      if (auto st = weak.lock()) Unpark(st, std::move(r));
                    }),
                    deferred);
        return;
      }
      case v1::StoreRequest::kAdd: {
        absl::StatusOr<int64_t> v = store_->Add(request_.add().key(), request_.add().delta(), deferred);
        status = v.status();
        if (v.ok()) out.set_number(*v);
        break;
      }
      case v1::StoreRequest::kCompareSet: {
        const auto& cs = request_.compare_set();
        absl::StatusOr<std::string> v = store_->CompareSet(cs.key(), cs.expected(), cs.desired(), deferred);
        status = v.status();
        if (v.ok()) out.set_value(std::move(*v));
        break;
      }
      case v1::StoreRequest::kCheck: {
        std::vector<std::string> keys(request_.check().keys().begin(), request_.check().keys().end());
        absl::StatusOr<bool> v = store_->Check(keys);
        status = v.status();
        if (v.ok()) out.set_flag(*v);
        break;
      }
      case v1::StoreRequest::kWait: {
        absl::StatusOr<absl::Duration> timeout = deps_.coordinator->StoreTimeout(request_.wait().timeout_ms());
        if (!timeout.ok()) {
          status = timeout.status();
          break;
        }
        Park();
        std::weak_ptr<State> weak = state_;
        std::vector<std::string> keys(request_.wait().keys().begin(), request_.wait().keys().end());
        store_->Wait(keys, *timeout,
                     MakePending<Unit>([weak, id](absl::StatusOr<Unit> v) {
                       v1::StoreResponse r;
                       r.set_id(id);
                       if (!v.ok()) *r.mutable_status() = ToStoreStatus(v.status());
                       if (auto st = weak.lock()) Unpark(st, std::move(r));
                     }),
                     deferred);
        return;
      }
      case v1::StoreRequest::kDeleteKey: {
        absl::StatusOr<bool> v = store_->DeleteKey(request_.delete_key().key());
        status = v.status();
        if (v.ok()) out.set_flag(*v);
        break;
      }
      case v1::StoreRequest::kNumKeys: {
        absl::StatusOr<int64_t> v = store_->NumKeys();
        status = v.status();
        if (v.ok()) out.set_number(*v);
        break;
      }
      case v1::StoreRequest::kOpen:
        status = absl::InvalidArgumentError("the store session is already open");
        break;
      default:
        status = absl::InvalidArgumentError("store request without an operation");
        break;
    }
    if (!status.ok()) *out.mutable_status() = ToStoreStatus(status);
    Send(state_, std::move(out));
  }

  void Park() {
    absl::MutexLock lock(&state_->mu);
    ++state_->outstanding;
  }

  static void Unpark(const std::shared_ptr<State>& st, v1::StoreResponse response) {
    absl::MutexLock lock(&st->mu);
    --st->outstanding;
    if (st->reactor == nullptr || st->finished) return;
    st->queue.push_back(std::move(response));
    st->reactor->PumpLocked();
  }

  static void Send(const std::shared_ptr<State>& st, v1::StoreResponse response) {
    absl::MutexLock lock(&st->mu);
    if (st->reactor == nullptr || st->finished) return;
    st->queue.push_back(std::move(response));
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
  RpcTimer timer_;
  std::shared_ptr<State> state_;
  std::shared_ptr<StoreServiceImpl::Sessions> sessions_;
  uint64_t session_id_ = 0;
  Principal who_;
  std::shared_ptr<KvStore> store_;
  v1::StoreRequest request_;
};

// Runs `op` against the scope's store for a unary store RPC.
template <typename Response, typename Op>
grpc::ServerUnaryReactor* UnaryStoreOp(const ServiceDeps& deps, grpc::CallbackServerContext* ctx,
                                       const char* method, const v1::StoreScope& scope,
                                       Response* out, Op op) {
  RpcTimer timer(deps, method);
  if (auto who = AuthorizeRun(deps, ctx, scope.run_id()); !who.ok()) {
    return Reply<Response>(ctx, timer, out, who.status());
  }
  absl::StatusOr<std::shared_ptr<KvStore>> store = deps.coordinator->OpenStore(scope);
  if (!store.ok()) return Reply<Response>(ctx, timer, out, store.status());
  Deferred deferred;
  return Reply<Response>(ctx, timer, out, op(**store, deferred));
}

// A blocking store RPC (get, wait): answered when the store completes the Pending.
template <typename Response, typename Value, typename Start, typename Convert>
grpc::ServerUnaryReactor* BlockingStoreOp(const ServiceDeps& deps, grpc::CallbackServerContext* ctx,
                                          const char* method, const v1::StoreScope& scope,
                                          Response* out, Start start, Convert convert) {
  auto* reactor = new PendingUnaryReactor<Response>(deps, method, out);
  if (auto who = AuthorizeRun(deps, ctx, scope.run_id()); !who.ok()) {
    reactor->pending()->Complete(who.status());
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<KvStore>> store = deps.coordinator->OpenStore(scope);
  if (!store.ok()) {
    reactor->pending()->Complete(store.status());
    return reactor;
  }
  PendingPtr<Response> reply = reactor->pending();
  Deferred deferred;
  start(**store, MakePending<Value>([reply, convert](absl::StatusOr<Value> v) {
          if (!v.ok()) {
            reply->Complete(v.status());
          } else {
            reply->Complete(convert(std::move(*v)));
          }
        }),
        deferred);
  return reactor;
}

}  // namespace

grpc::ServerBidiReactor<v1::StoreRequest, v1::StoreResponse>* StoreServiceImpl::Session(
    grpc::CallbackServerContext* ctx) {
  return new SessionReactor(deps_, sessions_, ctx);
}

void StoreServiceImpl::CloseSessions(const absl::Status& status) {
  std::vector<std::function<void(const absl::Status&)>> closers;
  {
    absl::MutexLock lock(&sessions_->mu);
    for (auto& [id, close] : sessions_->closers) closers.push_back(close);
  }
  for (auto& close : closers) close(status);
}

grpc::ServerUnaryReactor* StoreServiceImpl::Set(grpc::CallbackServerContext* ctx,
                                                const v1::StoreSetRequest* req,
                                                v1::StoreSetResponse* out) {
  return UnaryStoreOp(deps_, ctx, "StoreSet", req->scope(), out,
                      [req](KvStore& store, Deferred& d) -> absl::StatusOr<v1::StoreSetResponse> {
                        absl::Status s = store.Set(req->key(), req->value(), d);
                        if (!s.ok()) return s;
                        return v1::StoreSetResponse();
                      });
}

grpc::ServerUnaryReactor* StoreServiceImpl::Get(grpc::CallbackServerContext* ctx,
                                                const v1::StoreGetRequest* req,
                                                v1::StoreGetResponse* out) {
  Coordinator* c = deps_.coordinator;
  return BlockingStoreOp<v1::StoreGetResponse, std::string>(
      deps_, ctx, "StoreGet", req->scope(), out,
      [req, c](KvStore& store, PendingPtr<std::string> p, Deferred& d) {
        absl::StatusOr<absl::Duration> timeout = c->StoreTimeout(req->timeout_ms());
        if (!timeout.ok()) return d.Complete<std::string>(p, timeout.status());
        store.Get(req->key(), *timeout, std::move(p), d);
      },
      [](std::string v) {
        v1::StoreGetResponse r;
        r.set_value(std::move(v));
        return r;
      });
}

grpc::ServerUnaryReactor* StoreServiceImpl::Add(grpc::CallbackServerContext* ctx,
                                                const v1::StoreAddRequest* req,
                                                v1::StoreAddResponse* out) {
  return UnaryStoreOp(deps_, ctx, "StoreAdd", req->scope(), out,
                      [req](KvStore& store, Deferred& d) -> absl::StatusOr<v1::StoreAddResponse> {
                        absl::StatusOr<int64_t> v = store.Add(req->key(), req->delta(), d);
                        if (!v.ok()) return v.status();
                        v1::StoreAddResponse r;
                        r.set_value(*v);
                        return r;
                      });
}

grpc::ServerUnaryReactor* StoreServiceImpl::CompareSet(grpc::CallbackServerContext* ctx,
                                                       const v1::StoreCompareSetRequest* req,
                                                       v1::StoreCompareSetResponse* out) {
  return UnaryStoreOp(
      deps_, ctx, "StoreCompareSet", req->scope(), out,
      [req](KvStore& store, Deferred& d) -> absl::StatusOr<v1::StoreCompareSetResponse> {
        absl::StatusOr<std::string> v = store.CompareSet(req->key(), req->expected(), req->desired(), d);
        if (!v.ok()) return v.status();
        v1::StoreCompareSetResponse r;
        r.set_value(std::move(*v));
        return r;
      });
}

grpc::ServerUnaryReactor* StoreServiceImpl::Check(grpc::CallbackServerContext* ctx,
                                                  const v1::StoreCheckRequest* req,
                                                  v1::StoreCheckResponse* out) {
  return UnaryStoreOp(deps_, ctx, "StoreCheck", req->scope(), out,
                      [req](KvStore& store, Deferred&) -> absl::StatusOr<v1::StoreCheckResponse> {
                        std::vector<std::string> keys(req->keys().begin(), req->keys().end());
                        absl::StatusOr<bool> v = store.Check(keys);
                        if (!v.ok()) return v.status();
                        v1::StoreCheckResponse r;
                        r.set_all_exist(*v);
                        return r;
                      });
}

grpc::ServerUnaryReactor* StoreServiceImpl::Wait(grpc::CallbackServerContext* ctx,
                                                 const v1::StoreWaitRequest* req,
                                                 v1::StoreWaitResponse* out) {
  Coordinator* c = deps_.coordinator;
  return BlockingStoreOp<v1::StoreWaitResponse, Unit>(
      deps_, ctx, "StoreWait", req->scope(), out,
      [req, c](KvStore& store, PendingPtr<Unit> p, Deferred& d) {
        std::vector<std::string> keys(req->keys().begin(), req->keys().end());
        absl::StatusOr<absl::Duration> timeout = c->StoreTimeout(req->timeout_ms());
        if (!timeout.ok()) return d.Complete<Unit>(p, timeout.status());
        store.Wait(keys, *timeout, std::move(p), d);
      },
      [](Unit) { return v1::StoreWaitResponse(); });
}

grpc::ServerUnaryReactor* StoreServiceImpl::DeleteKey(grpc::CallbackServerContext* ctx,
                                                      const v1::StoreDeleteKeyRequest* req,
                                                      v1::StoreDeleteKeyResponse* out) {
  return UnaryStoreOp(deps_, ctx, "StoreDeleteKey", req->scope(), out,
                      [req](KvStore& store, Deferred&) -> absl::StatusOr<v1::StoreDeleteKeyResponse> {
                        absl::StatusOr<bool> v = store.DeleteKey(req->key());
                        if (!v.ok()) return v.status();
                        v1::StoreDeleteKeyResponse r;
                        r.set_deleted(*v);
                        return r;
                      });
}

grpc::ServerUnaryReactor* StoreServiceImpl::NumKeys(grpc::CallbackServerContext* ctx,
                                                    const v1::StoreNumKeysRequest* req,
                                                    v1::StoreNumKeysResponse* out) {
  return UnaryStoreOp(deps_, ctx, "StoreNumKeys", req->scope(), out,
                      [](KvStore& store, Deferred&) -> absl::StatusOr<v1::StoreNumKeysResponse> {
                        absl::StatusOr<int64_t> v = store.NumKeys();
                        if (!v.ok()) return v.status();
                        v1::StoreNumKeysResponse r;
                        r.set_num_keys(*v);
                        return r;
                      });
}

}  // namespace dt
