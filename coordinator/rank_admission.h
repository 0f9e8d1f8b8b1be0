// How many ranks dtcoord serves at once (dtcoord --max-ranks). A run's ranks are admitted when it
// is submitted and released when it ends, so a storm of submissions past the bound is refused at
// the door, and the runs already admitted keep the coordinator's time (heartbeats, store calls).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "coordinator/shared_budget.h"

namespace dt {

class RankAdmission {
 public:
  explicit RankAdmission(int64_t limit) : ranks_(limit) {}
  // Admits `ranks` more unless the total would pass the limit: RESOURCE_EXHAUSTED naming the
  // limit, what is held and what `what` (e.g. "this run") asks for; nothing is taken then.
  absl::Status Admit(int64_t ranks, const std::string& what);
  // Takes `ranks` whatever the limit: runs admitted before a restart (the limit may have been
  // lowered since) keep their place.
  void Readmit(int64_t ranks) { ranks_.Charge(ranks); }
  void Release(int64_t ranks) { ranks_.Release(ranks); }
  int64_t admitted() const { return ranks_.used(); }
  int64_t limit() const { return ranks_.limit(); }

 private:
  SharedBudget ranks_;
};

}  // namespace dt
