// A request gRPC cannot parse (a string field holding invalid UTF-8, a truncated message) never
// reaches a handler: the callback API then ends the call UNIMPLEMENTED with no message, which
// reads as "this server lacks the method". This interceptor turns that answer into
// INVALID_ARGUMENT naming the method and the likely cause.
#pragma once

#include <grpcpp/support/server_interceptor.h>

namespace dt {

class UnparsableRequestInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  // Intercepts only calls with a single request message (unary and server-streaming): streams
  // of requests are left alone, so the store session's hot path carries no interceptor.
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace dt
