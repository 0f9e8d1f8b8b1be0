#pragma once

#include "common/grpc_status.h"

namespace dt {

template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Call(const CoordinatorClient& client,
                              grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*), Stub& stub,
                              const Request& request, absl::Duration timeout) {
  std::unique_ptr<grpc::ClientContext> ctx = client.Context(timeout);
  Response response;
  grpc::Status status = (stub.*method)(ctx.get(), request, &response);
  if (!status.ok()) return FromCallStatus(status);
  return response;
}

}  // namespace dt
