// BarrierService: gRPC glue over Coordinator::Barrier.
#include "coordinator/services.h"

namespace dt {

grpc::ServerUnaryReactor* BarrierServiceImpl::Barrier(grpc::CallbackServerContext* ctx, const v1::BarrierRequest* req,
                                                      v1::BarrierResponse* out) {
  auto* reactor = new PendingUnaryReactor<v1::BarrierResponse>(deps_, "Barrier", out);
  if (auto who = AuthorizeRun(deps_, ctx, req->run_id()); !who.ok()) {
    reactor->pending()->Complete(who.status());
    return reactor;
  }
  deps_.coordinator->Barrier(*req, reactor->pending());
  reactor->HandedOver();
  return reactor;
}

}  // namespace dt
