// CheckpointService: gRPC glue over Coordinator's checkpoint rounds.
#include "coordinator/services.h"

namespace dt {

grpc::ServerUnaryReactor* CheckpointServiceImpl::BeginCheckpoint(grpc::CallbackServerContext* ctx,
                                                                 const v1::BeginCheckpointRequest* req,
                                                                 v1::BeginCheckpointResponse* out) {
  auto* reactor = new PendingUnaryReactor<v1::BeginCheckpointResponse>(deps_, "BeginCheckpoint", out);
  if (auto who = AuthorizeRun(deps_, ctx, req->run_id()); !who.ok()) {
    reactor->pending()->Complete(who.status());
    return reactor;
  }
  deps_.coordinator->BeginCheckpoint(*req, reactor->pending());
  reactor->HandedOver();
  return reactor;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::CommitCheckpoint(grpc::CallbackServerContext* ctx,
                                                                  const v1::CommitCheckpointRequest* req,
                                                                  v1::CommitCheckpointResponse* out) {
  auto* reactor = new PendingUnaryReactor<v1::CommitCheckpointResponse>(deps_, "CommitCheckpoint", out);
  if (auto who = AuthorizeRun(deps_, ctx, req->run_id()); !who.ok()) {
    reactor->pending()->Complete(who.status());
    return reactor;
  }
  deps_.coordinator->CommitCheckpoint(*req, reactor->pending());
  reactor->HandedOver();
  return reactor;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::AbortCheckpoint(grpc::CallbackServerContext* ctx,
                                                                 const v1::AbortCheckpointRequest* req,
                                                                 v1::AbortCheckpointResponse* out) {
  auto* reactor = new PendingUnaryReactor<v1::AbortCheckpointResponse>(deps_, "AbortCheckpoint", out);
  if (auto who = AuthorizeRun(deps_, ctx, req->run_id()); !who.ok()) {
    reactor->pending()->Complete(who.status());
    return reactor;
  }
  deps_.coordinator->AbortCheckpoint(*req, reactor->pending());
  reactor->HandedOver();
  return reactor;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::LatestCheckpoint(grpc::CallbackServerContext* ctx,
                                                                  const v1::LatestCheckpointRequest* req,
                                                                  v1::CheckpointInfo* out) {
  return ReplyForRun(deps_, ctx, "LatestCheckpoint", req->run_id(), out,
                     [&] { return deps_.coordinator->LatestCheckpoint(req->run_id()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::ListCheckpoints(grpc::CallbackServerContext* ctx,
                                                                 const v1::ListCheckpointsRequest* req,
                                                                 v1::ListCheckpointsResponse* out) {
  RpcTimer timer(deps_, "ListCheckpoints");
  if (auto who = AuthorizeRun(deps_, ctx, req->run_id()); !who.ok()) {
    return Reply<v1::ListCheckpointsResponse>(ctx, timer, out, who.status());
  }
  absl::StatusOr<std::vector<v1::CheckpointInfo>> list = deps_.coordinator->ListCheckpoints(req->run_id());
  if (!list.ok()) return Reply<v1::ListCheckpointsResponse>(ctx, timer, out, list.status());
  v1::ListCheckpointsResponse response;
  for (auto& c : *list) *response.add_checkpoints() = std::move(c);
  return Reply<v1::ListCheckpointsResponse>(ctx, timer, out, response);
}

}  // namespace dt
