// A Dtcoord inside another process, serving on 127.0.0.1:<free port> without the exporter and the
// W&B forwarder: for tests and benchmarks that want a real gRPC coordinator without a child process.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "client/coordinator_client.h"
#include "coordinator/dtcoord.h"

namespace dt {

struct EmbeddedOptions {
  CoordinatorTimeouts timeouts;
  absl::Duration health_check_period = absl::Milliseconds(50);
  int64_t store_bytes_per_run = kDefaultStoreBytesPerRun;
  size_t max_barrier_names = kMaxBarrierNames;
  std::string http_listen = "off";                         // the web console, e.g. "127.0.0.1:0"
  std::optional<v1::StoreSessionFeatures> store_features;  // ServerOptions::store_features
};

class EmbeddedCoordinator {
 public:
  // Throws std::runtime_error when it cannot start.
  explicit EmbeddedCoordinator(const std::string& state_dir, EmbeddedOptions options = {});
  ~EmbeddedCoordinator();

  const std::string& address() const { return dtcoord_->address(); }
  const std::string& admin_token() const { return dtcoord_->admin_token(); }
  Coordinator& coordinator() { return dtcoord_->coordinator(); }
  std::string console_url() const { return dtcoord_->console_url(); }
  // Calls parked in the coordinator now (a test waits for its call to be waiting).
  int64_t waiting_calls() const { return dtcoord_->waiting_calls(); }
  std::shared_ptr<CoordinatorClient> Client(const std::string& token, bool private_connection = false) const;
  std::shared_ptr<CoordinatorClient> AdminClient() const { return Client(admin_token()); }

 private:
  std::unique_ptr<Dtcoord> dtcoord_;
};

}  // namespace dt
