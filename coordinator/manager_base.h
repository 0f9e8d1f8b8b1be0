// What every manager of the coordinator (one per concern: run_persistence, rank_registration, store_barriers,
// health_monitor, metric_pipeline, stack_captures, checkpoint_leadership) starts from: the coordinator it serves
// and its run lookup, under the name the DT_OPEN_RUN_OR_* macros call.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"

namespace dt {

class Coordinator::ManagerBase {
 protected:
  explicit ManagerBase(Coordinator& coordinator) : coordinator_(coordinator) {}
  ManagerBase(const ManagerBase&) = delete;
  ManagerBase& operator=(const ManagerBase&) = delete;
  ~ManagerBase() = default;

  absl::StatusOr<RunPtr> FindRun(const std::string& run_id) const { return coordinator_.FindRun(run_id); }

  Coordinator& coordinator_;
};

}  // namespace dt
