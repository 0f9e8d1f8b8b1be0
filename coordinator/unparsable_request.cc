#include "coordinator/unparsable_request.h"

#include <string>

namespace dt {
namespace {

using grpc::experimental::InterceptionHookPoints;

class UnparsableRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit UnparsableRequestInterceptor(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsable_ = true;
    }
    if (unparsable_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        !methods->GetSendStatus().ok()) {
      methods->ModifySendStatus(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       method_ + ": the request could not be parsed (a string field holds invalid UTF-8, or the "
                                 "message is malformed or of another type); send text fields as UTF-8"));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool unparsable_ = false;
};

}  // namespace

grpc::experimental::Interceptor* UnparsableRequestInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  using Type = grpc::experimental::ServerRpcInfo::Type;
  if (info->type() != Type::UNARY && info->type() != Type::SERVER_STREAMING) return nullptr;
  return new UnparsableRequestInterceptor(info->method());
}

}  // namespace dt
