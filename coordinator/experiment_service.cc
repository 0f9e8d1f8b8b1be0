// ExperimentService: gRPC glue over Coordinator::GetExperiment.
#include "coordinator/services.h"

namespace dt {

grpc::ServerUnaryReactor* ExperimentServiceImpl::GetExperiment(grpc::CallbackServerContext* ctx,
                                                               const v1::GetExperimentRequest* req,
                                                               v1::Experiment* out) {
  RpcTimer timer(deps_, "GetExperiment");
  if (auto who = AuthorizeRun(deps_, ctx, req->run_id()); !who.ok()) {
    return Reply<v1::Experiment>(ctx, timer, out, who.status());
  }
  return Reply(ctx, timer, out, deps_.coordinator->GetExperiment(req->run_id()));
}

}  // namespace dt
