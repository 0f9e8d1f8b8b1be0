// StacksService: gRPC glue over Coordinator's stack captures.
#include "coordinator/services.h"
#include "coordinator/stack_captures.h"

namespace dt {

grpc::ServerUnaryReactor* StacksServiceImpl::ReportStacks(grpc::CallbackServerContext* ctx,
                                                          const v1::ReportStacksRequest* req,
                                                          v1::ReportStacksResponse* out) {
  return ReplyForRun(deps_, ctx, "ReportStacks", req->run_id(), out,
                     [&] { return deps_.coordinator->stacks().Report(*req); });
}

grpc::ServerUnaryReactor* StacksServiceImpl::CaptureStacks(grpc::CallbackServerContext* ctx,
                                                           const v1::CaptureStacksRequest* req, v1::StackCapture* out) {
  return WaitForRun(deps_, ctx, "CaptureStacks", req->run_id(), out,
                    [&](auto& reactor) { deps_.coordinator->stacks().Capture(*req, reactor.pending()); });
}

grpc::ServerUnaryReactor* StacksServiceImpl::GetStacks(grpc::CallbackServerContext* ctx,
                                                       const v1::GetStacksRequest* req, v1::GetStacksResponse* out) {
  return ReplyForRun(deps_, ctx, "GetStacks", req->run_id(), out,
                     [&] { return deps_.coordinator->stacks().Get(*req); });
}

}  // namespace dt
