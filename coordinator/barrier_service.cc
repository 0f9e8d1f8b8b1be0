// BarrierService: gRPC glue over Coordinator::Barrier.
#include "coordinator/services.h"

namespace dt {

grpc::ServerUnaryReactor* BarrierServiceImpl::Barrier(grpc::CallbackServerContext* ctx, const v1::BarrierRequest* req,
                                                      v1::BarrierResponse* out) {
  return WaitForRun(deps_, ctx, "Barrier", req->run_id(), out,
                    [&](auto& reactor) { deps_.coordinator->Barrier(*req, reactor.pending()); });
}

}  // namespace dt
