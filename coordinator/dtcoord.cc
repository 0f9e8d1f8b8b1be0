#include "coordinator/dtcoord.h"

#include "common/fs.h"
#include "common/log.h"

namespace dt {

absl::StatusOr<std::unique_ptr<Dtcoord>> Dtcoord::Start(DtcoordOptions options) {
  std::unique_ptr<Dtcoord> d(new Dtcoord(std::move(options)));
  if (absl::Status s = d->StartParts(); !s.ok()) return s;
  return d;
}

absl::Status Dtcoord::StartParts() {
  const std::string& dir = options_.state_dir;
  absl::StatusOr<StateDir> held = StateDir::Open(dir);
  if (!held.ok()) return held.status();
  state_dir_.emplace(std::move(*held));
  absl::StatusOr<std::unique_ptr<StateDb>> db = StateDb::Open(state_dir_->database_path());
  if (!db.ok()) return db.status();
  db_ = std::move(*db);
  absl::StatusOr<std::string> token = LoadOrCreateAdminToken(dir);
  if (!token.ok()) return token.status();
  admin_token_ = *token;

  timers_ = std::make_unique<TimerQueue>(RealClock::Get());
  timers_->Start();
  coordinator_ = std::make_unique<Coordinator>(options_.coordinator, RealClock::Get(), timers_.get(), db_.get());
  if (absl::Status s = coordinator_->Load(); !s.ok()) return s;
  if (options_.metrics_listen != "off") {
    ExporterOptions eo;
    eo.listen = options_.metrics_listen;
    absl::StatusOr<std::unique_ptr<PrometheusExporter>> e = PrometheusExporter::Start(eo, coordinator_.get());
    if (!e.ok()) return e.status();
    exporter_ = std::move(*e);
    coordinator_->AddObserver(exporter_.get());
    coordinator_->SetStats(exporter_.get());
    if (absl::Status s = WriteFileAtomic(JoinPath(dir, "metrics.addr"), exporter_->address() + "\n"); !s.ok()) {
      DT_LOG(Warning) << s.message();
    }
  }
  if (options_.wandb) {
    wandb::ForwarderOptions fo = *options_.wandb;
    if (fo.spool_dir.empty()) fo.spool_dir = JoinPath(dir, "wandb");
    forwarder_ = std::make_unique<wandb::Forwarder>(fo, coordinator_.get(), exporter_.get());
    if (absl::Status s = forwarder_->Load(); !s.ok()) return s;
    coordinator_->AddObserver(forwarder_.get());
    forwarder_->Start();
  }
  coordinator_->Start();
  auth_ = std::make_unique<Authenticator>(admin_token_, coordinator_.get());
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(coordinator_.get(), auth_.get(), options_.server, exporter_.get());
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  if (options_.http_listen != "off") {
    ConsoleOptions co;
    co.listen = options_.http_listen;
    wandb::Forwarder* forwarder = forwarder_.get();
    WandbRunsOf wandb_runs;
    if (forwarder != nullptr) wandb_runs = [forwarder](const std::string& run) { return forwarder->RunsOf(run); };
    absl::StatusOr<std::unique_ptr<ConsoleServer>> console =
        ConsoleServer::Start(co, coordinator_.get(), auth_.get(), std::move(wandb_runs));
    if (!console.ok()) return console.status();
    console_ = std::move(*console);
    if (absl::Status s = WriteFileAtomic(JoinPath(dir, "console.addr"), console_->address() + "\n"); !s.ok()) {
      DT_LOG(Warning) << s.message();
    }
  }
  if (absl::Status s = state_dir_->Publish(address()); !s.ok()) DT_LOG(Warning) << s.message();
  if (absl::Status s = WriteFileAtomic(JoinPath(dir, "dtcoord.addr"), address() + "\n"); !s.ok()) {
    DT_LOG(Warning) << s.message();
  }
  return absl::OkStatus();
}

void Dtcoord::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (console_) console_->Stop();
  if (server_) server_->Shutdown(grace);
  if (forwarder_) forwarder_->Stop();
  if (timers_) timers_->Stop();
}

Dtcoord::~Dtcoord() { Shutdown(absl::Seconds(1)); }

}  // namespace dt
