#include "coordinator/embedded.h"

#include <stdexcept>

namespace dt {

EmbeddedCoordinator::EmbeddedCoordinator(const std::string& state_dir, EmbeddedOptions options) {
  DtcoordOptions o;
  o.state_dir = state_dir;
  o.coordinator.timeouts = options.timeouts;
  o.coordinator.health_check_period = options.health_check_period;
  o.coordinator.store_bytes_per_run = options.store_bytes_per_run;
  o.coordinator.max_barrier_names = options.max_barrier_names;
  o.server.listen = "127.0.0.1:0";
  o.server.store_features = options.store_features;
  o.http_listen = options.http_listen;
  absl::StatusOr<std::unique_ptr<Dtcoord>> started = Dtcoord::Start(o);
  if (!started.ok()) throw std::runtime_error(std::string(started.status().message()));
  dtcoord_ = std::move(*started);
}

EmbeddedCoordinator::~EmbeddedCoordinator() = default;

std::shared_ptr<CoordinatorClient> EmbeddedCoordinator::Client(const std::string& token,
                                                               bool private_connection) const {
  ClientOptions o;
  o.address = address();
  o.token = token;
  o.private_connection = private_connection;
  auto c = CoordinatorClient::Connect(o);
  if (!c.ok()) throw std::runtime_error(std::string(c.status().message()));
  return *c;
}

}  // namespace dt
