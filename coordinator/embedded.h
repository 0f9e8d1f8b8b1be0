// dtcoord's parts wired together inside another process, serving on 127.0.0.1:<free port>: for
// tests and benchmarks that want a real gRPC coordinator without a child process.
#pragma once

#include <memory>
#include <string>

#include "client/coordinator_client.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "coordinator/state_db.h"
#include "coordinator/timer_queue.h"

namespace dt {

struct EmbeddedOptions {
  CoordinatorTimeouts timeouts;
  absl::Duration health_check_period = absl::Milliseconds(50);
};

class EmbeddedCoordinator {
 public:
  // Throws std::runtime_error when it cannot start.
  explicit EmbeddedCoordinator(const std::string& state_dir, EmbeddedOptions options = {});
  ~EmbeddedCoordinator();

  const std::string& address() const { return server_->address(); }
  const std::string& admin_token() const { return admin_token_; }
  Coordinator& coordinator() { return *coordinator_; }
  std::shared_ptr<CoordinatorClient> Client(const std::string& token, bool private_connection = false) const;
  std::shared_ptr<CoordinatorClient> AdminClient() const { return Client(admin_token_); }

 private:
  std::unique_ptr<StateDb> db_;
  std::unique_ptr<TimerQueue> timers_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string admin_token_;
};

}  // namespace dt
