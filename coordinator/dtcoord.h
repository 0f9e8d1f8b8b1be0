// dtcoord's parts wired together — the state dir and its database, the coordinator and its timers,
// the Prometheus exporter and the W&B forwarder (each optional), the gRPC server — in the order
// they must start and stop. The dtcoord binary runs one; tests and benchmarks run one in process.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/auth.h"
#include "coordinator/console/console_server.h"
#include "coordinator/coordinator.h"
#include "coordinator/prometheus_exporter.h"
#include "coordinator/server.h"
#include "coordinator/state_db.h"
#include "coordinator/state_dir.h"
#include "coordinator/timer_queue.h"
#include "coordinator/wandb/forwarder.h"

namespace dt {

struct DtcoordOptions {
  std::string state_dir;
  CoordinatorOptions coordinator;
  ServerOptions server;
  std::string metrics_listen = "off";  // Prometheus /metrics HOST:PORT, or "off"
  std::string http_listen = "off";     // the web console's HOST:PORT, or "off"
  // W&B forwarding; its spool_dir defaults to <state_dir>/wandb. nullopt: no forwarder.
  std::optional<wandb::ForwarderOptions> wandb;
};

class Dtcoord {
 public:
  // Holds the state dir (refused while another dtcoord holds it), loads every run, and serves.
  // Writes <state_dir>/dtcoord.addr (and metrics.addr, console.addr) with the addresses actually
  // bound.
  static absl::StatusOr<std::unique_ptr<Dtcoord>> Start(DtcoordOptions options);
  ~Dtcoord();
  Dtcoord(const Dtcoord&) = delete;
  Dtcoord& operator=(const Dtcoord&) = delete;

  const std::string& address() const { return server_->address(); }
  const std::string& admin_token() const { return admin_token_; }
  const std::string& state_dir() const { return options_.state_dir; }
  // "" without the exporter.
  std::string metrics_address() const { return exporter_ ? exporter_->address() : ""; }
  // The web console's URL; "" without it.
  std::string console_url() const { return console_ ? console_->url() : ""; }
  Coordinator& coordinator() { return *coordinator_; }
  int64_t waiting_calls() const { return server_->waiting_calls(); }

  // Fails waiting calls (UNAVAILABLE), drains in-flight calls for up to `grace`, stops the
  // forwarder and the timers. Once; the destructor does it with a second's grace otherwise.
  void Shutdown(absl::Duration grace);

 private:
  explicit Dtcoord(DtcoordOptions options) : options_(std::move(options)) {}
  absl::Status StartParts();

  DtcoordOptions options_;
  std::optional<StateDir> state_dir_;
  std::unique_ptr<StateDb> db_;
  std::string admin_token_;
  std::unique_ptr<TimerQueue> timers_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<PrometheusExporter> exporter_;
  std::unique_ptr<wandb::Forwarder> forwarder_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<ConsoleServer> console_;
  bool shut_down_ = false;
};

}  // namespace dt
