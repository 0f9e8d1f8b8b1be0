// A coordinator for fuzz targets: its logic on a fake clock over a SQLite database in a scratch
// directory, opened (and reopened, to check what survives) the way dtcoord opens it.
#pragma once

#include <memory>
#include <string>

#include "common/fs.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/state_db.h"
#include "coordinator/timer_queue.h"

namespace dt::fuzz {

struct FuzzCoordinator {
  FakeClock clock;
  TimerQueue timers{&clock};
  std::unique_ptr<StateDb> db;
  std::unique_ptr<Coordinator> coordinator;

  static CoordinatorOptions Options() {
    CoordinatorOptions options;
    options.timeouts.heartbeat_interval = absl::Seconds(2);
    options.timeouts.heartbeat_timeout = absl::Seconds(30);
    options.timeouts.rendezvous_timeout = absl::Minutes(5);
    options.store_bytes_per_run = 1 << 20;
    options.store_bytes_total = 4 << 20;
    return options;
  }

  absl::Status Open(const std::string& dir) {
    auto opened = StateDb::Open(JoinPath(dir, "state.db"));
    if (!opened.ok()) return opened.status();
    db = std::move(*opened);
    coordinator = std::make_unique<Coordinator>(Options(), &clock, &timers, db.get());
    return coordinator->Load();
  }

  void Close() {
    if (coordinator) coordinator->Shutdown();
    coordinator.reset();
    db.reset();
  }
};

}  // namespace dt::fuzz
