// RendezvousService: gRPC glue over Coordinator's rendezvous and health calls.
#include <optional>

#include "absl/strings/str_cat.h"
#include "coordinator/health_monitor.h"
#include "coordinator/rank_registration.h"
#include "coordinator/services.h"

namespace dt {
namespace {

// One node agent's heartbeat stream: each message answered, in order, before the next is read
// (an agent sends one every heartbeat interval), unless it asks for changes only and its answer is
// the last one sent. Authorized once, for the first message's run.
class NodeHeartbeatStream final : public grpc::ServerBidiReactor<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse> {
 public:
  NodeHeartbeatStream(const ServiceDeps& deps, grpc::CallbackServerContext* ctx)
      : deps_(deps), ctx_(ctx), timer_(deps, "NodeHeartbeats") {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      End(absl::OkStatus());  // the agent closed its side
      return;
    }
    if (run_id_.empty()) {
      if (auto who = AuthorizeRun(deps_, ctx_, request_.run_id()); !who.ok()) {
        End(who.status());
        return;
      }
      run_id_ = request_.run_id();
    } else if (request_.run_id() != run_id_) {
      End(absl::InvalidArgumentError(absl::StrCat("this stream heartbeats for run ", run_id_, ", not ",
                                                  request_.run_id(), ": open one stream per run")));
      return;
    }
    absl::StatusOr<v1::NodeHeartbeatResponse> answer = deps_.coordinator->health().NodeHeartbeat(request_);
    if (!answer.ok()) {
      End(answer.status());
      return;
    }
    if (request_.answer_changes_only()) {
      // response_ still holds the answer last written (a write ends before the next read starts).
      if (!last_answer_) last_answer_ = response_.SerializeAsString();
      std::string bytes = answer->SerializeAsString();
      if (bytes == *last_answer_) {
        StartRead(&request_);  // nothing new for the agent: no write
        return;
      }
      last_answer_ = std::move(bytes);
    } else {
      last_answer_.reset();  // compared only when a message asks for changes only
    }
    response_ = std::move(*answer);
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::CancelledError("the node agent went away"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  void End(const absl::Status& status) {
    timer_.Done(status.code());
    Finish(ToGrpcStatus(status));
  }

  const ServiceDeps deps_;
  grpc::CallbackServerContext* ctx_;
  RpcTimer timer_;
  std::string run_id_;  // set by the first message, once authorized
  v1::NodeHeartbeatRequest request_;
  v1::NodeHeartbeatResponse response_;
  std::optional<std::string> last_answer_;  // response_ serialized, once a message compared with it
};

}  // namespace

grpc::ServerBidiReactor<v1::NodeHeartbeatRequest, v1::NodeHeartbeatResponse>* RendezvousServiceImpl::NodeHeartbeats(
    grpc::CallbackServerContext* ctx) {
  return new NodeHeartbeatStream(deps_, ctx);
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Register(grpc::CallbackServerContext* ctx,
                                                          const v1::RegisterRequest* req, v1::RegisterResponse* out) {
  return WaitForRun(deps_, ctx, "Register", req->run_id(), out, [&](auto& reactor) {
    Coordinator::RankRegistration* registration = &deps_.coordinator->registration();
    std::string run_id = req->run_id(), node = req->node(), incarnation = req->incarnation();
    int slot = req->local_slot();
    const void* call = reactor.pending().get();
    reactor.set_on_cancel([registration, run_id, node, slot, incarnation, call] {
      registration->WithdrawRegistration(run_id, node, slot, incarnation, call);
    });
    registration->Register(*req, reactor.pending());
  });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::RegisterNode(grpc::CallbackServerContext* ctx,
                                                              const v1::RegisterNodeRequest* req,
                                                              v1::RegisterNodeResponse* out) {
  return WaitForRun(deps_, ctx, "RegisterNode", req->run_id(), out, [&](auto& reactor) {
    Coordinator::RankRegistration* registration = &deps_.coordinator->registration();
    const void* call = reactor.pending().get();
    reactor.set_on_cancel(
        [registration, request = *req, call] { registration->WithdrawNodeRegistration(request, call); });
    registration->RegisterNode(*req, reactor.pending());
  });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::NodeHeartbeat(grpc::CallbackServerContext* ctx,
                                                               const v1::NodeHeartbeatRequest* req,
                                                               v1::NodeHeartbeatResponse* out) {
  return ReplyForRun(deps_, ctx, "NodeHeartbeat", req->run_id(), out,
                     [&] { return deps_.coordinator->health().NodeHeartbeat(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                           const v1::HeartbeatRequest* req,
                                                           v1::HeartbeatResponse* out) {
  return ReplyForRun(deps_, ctx, "Heartbeat", req->run_id(), out,
                     [&] { return deps_.coordinator->health().Heartbeat(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::ReportError(grpc::CallbackServerContext* ctx,
                                                             const v1::ReportErrorRequest* req,
                                                             v1::ReportErrorResponse* out) {
  return ReplyForRun(deps_, ctx, "ReportError", req->run_id(), out,
                     [&] { return deps_.coordinator->health().ReportError(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::ReportStopped(grpc::CallbackServerContext* ctx,
                                                               const v1::ReportStoppedRequest* req,
                                                               v1::ReportStoppedResponse* out) {
  return ReplyForRun(deps_, ctx, "ReportStopped", req->run_id(), out,
                     [&] { return deps_.coordinator->health().ReportStopped(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::ReportPreflight(grpc::CallbackServerContext* ctx,
                                                                 const v1::ReportPreflightRequest* req,
                                                                 v1::ReportPreflightResponse* out) {
  return ReplyForRun(deps_, ctx, "ReportPreflight", req->run_id(), out,
                     [&] { return deps_.coordinator->health().ReportPreflight(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                                       v1::LeaveResponse* out) {
  return ReplyForRun(deps_, ctx, "Leave", req->run_id(), out, [&] { return deps_.coordinator->health().Leave(*req); });
}

}  // namespace dt
