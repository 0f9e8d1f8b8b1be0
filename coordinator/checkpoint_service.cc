// CheckpointService: gRPC glue over Coordinator's checkpoint rounds.
#include "coordinator/checkpoint_leadership.h"
#include "coordinator/services.h"

namespace dt {

grpc::ServerUnaryReactor* CheckpointServiceImpl::BeginCheckpoint(grpc::CallbackServerContext* ctx,
                                                                 const v1::BeginCheckpointRequest* req,
                                                                 v1::BeginCheckpointResponse* out) {
  return WaitForRun(deps_, ctx, "BeginCheckpoint", req->run_id(), out,
                    [&](auto& reactor) { deps_.coordinator->checkpoints().Begin(*req, reactor.pending()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::CommitCheckpoint(grpc::CallbackServerContext* ctx,
                                                                  const v1::CommitCheckpointRequest* req,
                                                                  v1::CommitCheckpointResponse* out) {
  return WaitForRun(deps_, ctx, "CommitCheckpoint", req->run_id(), out,
                    [&](auto& reactor) { deps_.coordinator->checkpoints().Commit(*req, reactor.pending()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::AbortCheckpoint(grpc::CallbackServerContext* ctx,
                                                                 const v1::AbortCheckpointRequest* req,
                                                                 v1::AbortCheckpointResponse* out) {
  return WaitForRun(deps_, ctx, "AbortCheckpoint", req->run_id(), out,
                    [&](auto& reactor) { deps_.coordinator->checkpoints().Abort(*req, reactor.pending()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::LatestCheckpoint(grpc::CallbackServerContext* ctx,
                                                                  const v1::LatestCheckpointRequest* req,
                                                                  v1::CheckpointInfo* out) {
  return ReplyForRun(deps_, ctx, "LatestCheckpoint", req->run_id(), out,
                     [&] { return deps_.coordinator->checkpoints().Latest(req->run_id()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::ListCheckpoints(grpc::CallbackServerContext* ctx,
                                                                 const v1::ListCheckpointsRequest* req,
                                                                 v1::ListCheckpointsResponse* out) {
  return ReplyForRun(
      deps_, ctx, "ListCheckpoints", req->run_id(), out, [&]() -> absl::StatusOr<v1::ListCheckpointsResponse> {
        absl::StatusOr<std::vector<v1::CheckpointInfo>> list = deps_.coordinator->checkpoints().List(req->run_id());
        if (!list.ok()) return list.status();
        v1::ListCheckpointsResponse response;
        for (auto& c : *list) *response.add_checkpoints() = std::move(c);
        return response;
      });
}

}  // namespace dt
