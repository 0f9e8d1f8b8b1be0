// gRPC callback-API glue shared by the *_service.cc files: authentication, unary replies that
// may arrive later (waiting calls never pin a thread), and per-RPC accounting.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator.h"
#include "coordinator/observers.h"
#include "coordinator/pending.h"

namespace dt {

// What every service needs.
struct ServiceDeps {
  Coordinator* coordinator = nullptr;
  const Authenticator* auth = nullptr;
  RpcObserver* rpc_observer = nullptr;  // may be null
  // Calls parked in the coordinator waiting for others (registrations, barriers, checkpoint
  // arrivals and commits, store gets and waits). Owned by the server.
  std::atomic<int64_t>* waiting_calls = nullptr;
};

// Records the RPC's outcome when it finishes.
class RpcTimer {
 public:
  RpcTimer(const ServiceDeps& deps, const char* method)
      : observer_(deps.rpc_observer), method_(method), start_(absl::Now()) {}
  void Done(absl::StatusCode code) const {
    if (observer_ != nullptr) observer_->OnRpcDone(method_, code, absl::Now() - start_);
  }

 private:
  RpcObserver* observer_;
  const char* method_;
  absl::Time start_;
};

// Finishes a unary call now with `result`.
template <typename Response>
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const RpcTimer& timer, Response* out,
                                absl::StatusOr<Response> result) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (result.ok()) *out = std::move(*result);
  timer.Done(result.status().code());
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

// Authenticates the caller and checks that it may act on `run_id` (admin or that run's token).
inline absl::StatusOr<Principal> AuthorizeRun(const ServiceDeps& deps, grpc::CallbackServerContext* ctx,
                                              const std::string& run_id) {
  absl::StatusOr<Principal> who = deps.auth->Authenticate(*ctx);
  if (!who.ok()) return who.status();
  if (absl::Status s = Coordinator::Authorize(*who, run_id); !s.ok()) return s;
  return who;
}

// A unary call on one run, answered now: the caller must be the admin or `run_id`'s token, then
// `call` (the coordinator's method) gives the answer. The common shape of the services' handlers.
template <typename Response, typename Call>
grpc::ServerUnaryReactor* ReplyForRun(const ServiceDeps& deps, grpc::CallbackServerContext* ctx, const char* method,
                                      const std::string& run_id, Response* out, Call&& call) {
  RpcTimer timer(deps, method);
  if (auto who = AuthorizeRun(deps, ctx, run_id); !who.ok()) return Reply<Response>(ctx, timer, out, who.status());
  return Reply<Response>(ctx, timer, out, call());
}

inline absl::Status AuthorizeAdmin(const ServiceDeps& deps, grpc::CallbackServerContext* ctx, absl::string_view what) {
  absl::StatusOr<Principal> who = deps.auth->Authenticate(*ctx);
  if (!who.ok()) return who.status();
  return Coordinator::RequireAdmin(*who, what);
}

// A unary call only the admin may make, answered now by `call` (the coordinator's method).
template <typename Response, typename Call>
grpc::ServerUnaryReactor* ReplyForAdmin(const ServiceDeps& deps, grpc::CallbackServerContext* ctx, const char* method,
                                        Response* out, Call&& call) {
  RpcTimer timer(deps, method);
  if (absl::Status s = AuthorizeAdmin(deps, ctx, method); !s.ok()) return Reply<Response>(ctx, timer, out, s);
  return Reply<Response>(ctx, timer, out, call());
}

// A unary call answered later: the coordinator completes the Pending; a cancelled call completes
// it with CANCELLED and runs `on_cancel` (e.g. to withdraw a registration).
template <typename Response>
class PendingUnaryReactor : public grpc::ServerUnaryReactor {
 public:
  PendingUnaryReactor(const ServiceDeps& deps, const char* method, Response* out)
      : timer_(deps, method), waiting_calls_(deps.waiting_calls) {
    pending_ = MakePending<Response>([this, out](absl::StatusOr<Response> result) {
      if (result.ok()) *out = std::move(*result);
      if (stage_.exchange(kDone) == kWaiting && waiting_calls_ != nullptr) --*waiting_calls_;
      timer_.Done(result.status().code());
      Finish(ToGrpcStatus(result.status()));
    });
  }
  const PendingPtr<Response>& pending() const { return pending_; }
  // After the call was handed to the coordinator: counted as waiting unless it was answered at
  // once.
  void HandedOver() {
    int running = kRunning;
    if (stage_.compare_exchange_strong(running, kWaiting) && waiting_calls_ != nullptr) ++*waiting_calls_;
  }
  void set_on_cancel(std::function<void()> fn) { on_cancel_ = std::move(fn); }

  void OnCancel() override {
    if (pending_->Complete(absl::CancelledError("the caller cancelled the call")) && on_cancel_) {
      on_cancel_();
    }
  }
  void OnDone() override { delete this; }

 private:
  static constexpr int kRunning = 0, kWaiting = 1, kDone = 2;
  RpcTimer timer_;
  std::atomic<int64_t>* waiting_calls_;
  std::atomic<int> stage_{kRunning};
  PendingPtr<Response> pending_;
  std::function<void()> on_cancel_;
};

// A unary call on one run that may wait (for the other ranks, a verification, a capture): the
// caller must be the admin or `run_id`'s token, then `start(reactor)` hands reactor.pending() to
// the coordinator, which completes it now or later (and may first set what a cancellation does).
// The call counts as waiting from then until it is answered. The other common shape of the
// services' handlers, beside ReplyForRun.
template <typename Response, typename Start>
grpc::ServerUnaryReactor* WaitForRun(const ServiceDeps& deps, grpc::CallbackServerContext* ctx, const char* method,
                                     const std::string& run_id, Response* out, Start&& start) {
  auto* reactor = new PendingUnaryReactor<Response>(deps, method, out);
  if (auto who = AuthorizeRun(deps, ctx, run_id); !who.ok()) {
    reactor->pending()->Complete(who.status());
    return reactor;
  }
  start(*reactor);
  reactor->HandedOver();
  return reactor;
}

}  // namespace dt
