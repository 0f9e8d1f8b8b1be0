// ExperimentService: gRPC glue over Coordinator::GetExperiment.
#include "coordinator/services.h"

namespace dt {

grpc::ServerUnaryReactor* ExperimentServiceImpl::GetExperiment(grpc::CallbackServerContext* ctx,
                                                               const v1::GetExperimentRequest* req,
                                                               v1::Experiment* out) {
  return ReplyForRun(deps_, ctx, "GetExperiment", req->run_id(), out,
                     [&] { return deps_.coordinator->GetExperiment(req->run_id()); });
}

}  // namespace dt
