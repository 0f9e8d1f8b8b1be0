#include "coordinator/callback_queue_keeper.h"

#include <chrono>

#include <grpcpp/generic/generic_stub.h>

namespace dt {
namespace {

constexpr char kHealthCheck[] = "/grpc.health.v1.Health/Check";

}  // namespace

CallbackQueueKeeper::CallbackQueueKeeper(grpc::Server* server, absl::Duration period)
    : channel_(server->InProcessChannel(grpc::ChannelArguments())), period_(period) {
  thread_ = std::thread([this] { Loop(); });
}

CallbackQueueKeeper::~CallbackQueueKeeper() { Stop(); }

void CallbackQueueKeeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t CallbackQueueKeeper::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

void CallbackQueueKeeper::Loop() {
  grpc::GenericStub stub(channel_);
  grpc::CompletionQueue cq;
  // An empty HealthCheckRequest (the server as a whole) is zero bytes on the wire.
  grpc::Slice empty("");
  const grpc::ByteBuffer request(&empty, 1);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) break;
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::ByteBuffer response;
    grpc::Status status;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
        stub.PrepareUnaryCall(&context, kHealthCheck, request, &cq);
    call->StartCall();
    call->Finish(&response, &status, this);
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    absl::MutexLock lock(&mu_);
    if (ok && status.ok()) ++calls_;
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace dt
