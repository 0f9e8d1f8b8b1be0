// The gRPC server of dtcoord: every dt.v1 service, grpc.health.v1.Health and server reflection,
// on one listening address, with optional TLS.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "coordinator/auth.h"
#include "coordinator/callback_queue_keeper.h"
#include "coordinator/coordinator.h"
#include "coordinator/reactors.h"
#include "dt/v1/store.pb.h"

namespace dt {

class StoreServiceImpl;

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // port 0 picks a free port
  std::string tls_cert;                    // PEM files; both or neither
  std::string tls_key;
  // What the store sessions accept beyond the stream's first version (and say so in their answer
  // to `open`); unset: everything this build has. An empty one serves as a coordinator before
  // StoreSessionFeatures did, for tests of newer clients against older coordinators.
  std::optional<v1::StoreSessionFeatures> store_features;
};

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(Coordinator* coordinator, const Authenticator* auth,
                                                                  const ServerOptions& options,
                                                                  RpcObserver* rpc_observer = nullptr);
  ~CoordinatorServer();

  // "host:port" actually bound.
  const std::string& address() const { return address_; }
  // Calls parked in the coordinator now, waiting for other ranks or keys.
  int64_t waiting_calls() const { return waiting_calls_.load(); }

  // Fails waiting calls (UNAVAILABLE), stops accepting, lets in-flight calls finish until
  // `grace` has passed, then cancels what is left.
  void Shutdown(absl::Duration grace);

 private:
  CoordinatorServer() = default;
  Coordinator* coordinator_ = nullptr;
  std::vector<std::unique_ptr<grpc::Service>> services_;
  StoreServiceImpl* store_service_ = nullptr;  // owned by services_
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CallbackQueueKeeper> keeper_;  // ends before server_ shuts down
  std::string address_;
  bool shut_down_ = false;
  std::atomic<int64_t> waiting_calls_{0};
};

}  // namespace dt
