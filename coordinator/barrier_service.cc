// BarrierService: gRPC glue over Coordinator::StoreAndBarriers::Barrier.
#include "coordinator/services.h"
#include "coordinator/store_barriers.h"

namespace dt {

grpc::ServerUnaryReactor* BarrierServiceImpl::Barrier(grpc::CallbackServerContext* ctx, const v1::BarrierRequest* req,
                                                      v1::BarrierResponse* out) {
  return WaitForRun(deps_, ctx, "Barrier", req->run_id(), out,
                    [&](auto& reactor) { deps_.coordinator->store_barriers().Barrier(*req, reactor.pending()); });
}

}  // namespace dt
