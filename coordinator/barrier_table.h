// Named barriers of one run generation. A barrier releases when every one of `world_size` ranks
// has arrived; its timeout is fixed by the first arrival; a timeout names the ranks that did not
// come; Abort() fails every open barrier at once (a participant died, the run ended).
//
// A rank's k-th arrival at a name joins instance k of that barrier, so per-step names are not
// needed. Not thread-safe: the coordinator calls it under the run's lock; timer expiries arrive
// through the `on_expire` hook so the caller can take that lock first.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/limits.h"
#include "coordinator/pending.h"
#include "coordinator/timer_queue.h"
#include "dt/v1/runs.pb.h"

namespace dt {

struct BarrierRelease {
  uint64_t sequence = 0;
  absl::Duration waited;
};

class BarrierTable {
 public:
  // `describe_rank` renders a rank for messages ("rank 3 (node n2, host h2)").
  // `schedule_expiry(when, name, sequence)` must arrange for Expire(name, sequence) to be called
  // at `when` with the caller's lock held; it returns a timer id to cancel on release.
  using DescribeRank = std::function<std::string(int rank)>;
  using ScheduleExpiry = std::function<TimerQueue::Id(absl::Time when, const std::string& name, uint64_t sequence)>;

  // `max_names`: distinct names the table takes (each keeps its count for the table's life);
  // a new name past it is RESOURCE_EXHAUSTED.
  BarrierTable(std::string scope, int world_size, const Clock* clock, TimerQueue* timers, DescribeRank describe_rank,
               ScheduleExpiry schedule_expiry, size_t max_names = kMaxBarrierNames);
  ~BarrierTable();

  // `sequence` 0 lets the table count; a sequence at or below the released count answers OK at
  // once (the caller's earlier reply was lost).
  void Arrive(int rank, const std::string& name, uint64_t sequence, absl::Duration timeout,
              PendingPtr<BarrierRelease> reply, Deferred& deferred);
  // An arrival a node relay carries for `rank` (it waits on its node, not here): counted like
  // Arrive's, never answered; if `rank` already arrived at that instance, its own arrival stays.
  void ArriveRelayed(int rank, const std::string& name, uint64_t sequence, absl::Duration timeout, Deferred& deferred);
  void Expire(const std::string& name, uint64_t sequence, Deferred& deferred);
  void Abort(const absl::Status& cause, Deferred& deferred);

  // Barriers with arrivals, with who is still missing (for status), by name.
  std::vector<v1::OpenBarrier> Open() const;

 private:
  struct Instance {
    uint64_t sequence = 0;
    absl::Time first_arrival;
    absl::Duration timeout;
    std::map<int, std::pair<PendingPtr<BarrierRelease>, absl::Time>> arrived;  // rank → reply
    TimerQueue::Id timer = 0;
  };
  struct Barrier {
    uint64_t released = 0;
    bool open = false;
    Instance pending;
  };

  const std::string scope_;
  const int world_size_;
  const size_t max_names_;
  const Clock* clock_;
  TimerQueue* timers_;
  DescribeRank describe_rank_;
  ScheduleExpiry schedule_expiry_;
  absl::Status aborted_;
  absl::flat_hash_map<std::string, Barrier> barriers_;
};

}  // namespace dt
