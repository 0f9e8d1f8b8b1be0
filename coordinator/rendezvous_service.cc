// RendezvousService: gRPC glue over Coordinator's rendezvous and health calls.
#include "coordinator/services.h"

namespace dt {

grpc::ServerUnaryReactor* RendezvousServiceImpl::Register(grpc::CallbackServerContext* ctx,
                                                          const v1::RegisterRequest* req, v1::RegisterResponse* out) {
  auto* reactor = new PendingUnaryReactor<v1::RegisterResponse>(deps_, "Register", out);
  if (auto who = AuthorizeRun(deps_, ctx, req->run_id()); !who.ok()) {
    reactor->pending()->Complete(who.status());
    return reactor;
  }
  Coordinator* coordinator = deps_.coordinator;
  std::string run_id = req->run_id(), node = req->node(), incarnation = req->incarnation();
  int slot = req->local_slot();
  const void* call = reactor->pending().get();
  reactor->set_on_cancel([coordinator, run_id, node, slot, incarnation, call] {
    coordinator->WithdrawRegistration(run_id, node, slot, incarnation, call);
  });
  coordinator->Register(*req, reactor->pending());
  reactor->HandedOver();
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::RegisterNode(grpc::CallbackServerContext* ctx,
                                                              const v1::RegisterNodeRequest* req,
                                                              v1::RegisterNodeResponse* out) {
  auto* reactor = new PendingUnaryReactor<v1::RegisterNodeResponse>(deps_, "RegisterNode", out);
  if (auto who = AuthorizeRun(deps_, ctx, req->run_id()); !who.ok()) {
    reactor->pending()->Complete(who.status());
    return reactor;
  }
  Coordinator* coordinator = deps_.coordinator;
  const void* call = reactor->pending().get();
  reactor->set_on_cancel([coordinator, request = *req, call] { coordinator->WithdrawNodeRegistration(request, call); });
  coordinator->RegisterNode(*req, reactor->pending());
  reactor->HandedOver();
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::NodeHeartbeat(grpc::CallbackServerContext* ctx,
                                                               const v1::NodeHeartbeatRequest* req,
                                                               v1::NodeHeartbeatResponse* out) {
  return ReplyForRun(deps_, ctx, "NodeHeartbeat", req->run_id(), out,
                     [&] { return deps_.coordinator->NodeHeartbeat(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                           const v1::HeartbeatRequest* req,
                                                           v1::HeartbeatResponse* out) {
  return ReplyForRun(deps_, ctx, "Heartbeat", req->run_id(), out, [&] { return deps_.coordinator->Heartbeat(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::ReportError(grpc::CallbackServerContext* ctx,
                                                             const v1::ReportErrorRequest* req,
                                                             v1::ReportErrorResponse* out) {
  return ReplyForRun(deps_, ctx, "ReportError", req->run_id(), out,
                     [&] { return deps_.coordinator->ReportError(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::ReportStopped(grpc::CallbackServerContext* ctx,
                                                               const v1::ReportStoppedRequest* req,
                                                               v1::ReportStoppedResponse* out) {
  return ReplyForRun(deps_, ctx, "ReportStopped", req->run_id(), out,
                     [&] { return deps_.coordinator->ReportStopped(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::ReportPreflight(grpc::CallbackServerContext* ctx,
                                                                 const v1::ReportPreflightRequest* req,
                                                                 v1::ReportPreflightResponse* out) {
  return ReplyForRun(deps_, ctx, "ReportPreflight", req->run_id(), out,
                     [&] { return deps_.coordinator->ReportPreflight(*req); });
}

grpc::ServerUnaryReactor* RendezvousServiceImpl::Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                                       v1::LeaveResponse* out) {
  return ReplyForRun(deps_, ctx, "Leave", req->run_id(), out, [&] { return deps_.coordinator->Leave(*req); });
}

}  // namespace dt
