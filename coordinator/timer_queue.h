// Deadlines for waiting callers (store gets, barriers, rendezvous, checkpoint leases). One thread
// serves every timer of the coordinator; tests call RunDue() after advancing a FakeClock instead.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"

namespace dt {

class TimerQueue {
 public:
  using Id = uint64_t;
  explicit TimerQueue(const Clock* clock);
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` once `clock->Now() >= when`, on the timer thread (or inside RunDue). Never under a
  // lock of the caller's.
  Id Schedule(absl::Time when, std::function<void()> fn);
  // True if the timer had not fired yet; it will not fire.
  bool Cancel(Id id);

  // Runs every timer that is due now; returns how many ran.
  int RunDue();
  size_t size() const;

  // Serves timers from a background thread until Stop() (idempotent).
  void Start();
  void Stop();

  const Clock* clock() const { return clock_; }

 private:
  struct Entry {
    absl::Time when;
    Id id;
    bool operator>(const Entry& o) const { return when > o.when || (when == o.when && id > o.id); }
  };
  void Loop();

  const Clock* clock_;
  mutable absl::Mutex mu_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Id, std::function<void()>> fns_ ABSL_GUARDED_BY(mu_);
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dt
