#pragma once

#include "common/grpc_status.h"

namespace dt {

// `wait_for_ready`: while the channel cannot connect, wait (until the timeout) instead of failing at
// once. The waiting thread also drives the reconnection: without a call that waits, a channel in
// TRANSIENT_FAILURE notices that the coordinator is back only when gRPC's backup poller runs
// (every 5 s), longer than a short heartbeat timeout.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Call(const CoordinatorClient& client,
                              grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*), Stub& stub,
                              const Request& request, absl::Duration timeout, bool wait_for_ready) {
  std::unique_ptr<grpc::ClientContext> ctx = client.Context(timeout);
  if (wait_for_ready) ctx->set_wait_for_ready(true);
  Response response;
  grpc::Status status = (stub.*method)(ctx.get(), request, &response);
  if (!status.ok()) return FromCallStatus(status);
  return response;
}

}  // namespace dt
