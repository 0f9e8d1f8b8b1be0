// Time source for the coordinator's logic. Tests drive a FakeClock; the server uses RealClock.
#pragma once

#include <algorithm>
#include <chrono>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dt {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// A monotonic clock anchored to the wall clock when the process started: every deadline the
// coordinator keeps (store waits, barriers, leases, heartbeats) is measured on one clock that NTP
// cannot slew or step, so a timeout never fires early by the caller's monotonic clock. The times it
// stamps stay wall-clock times, off by what the wall clock was corrected since the start.
class RealClock : public Clock {
 public:
  absl::Time Now() const override {
    static const std::chrono::steady_clock::time_point steady_start = std::chrono::steady_clock::now();
    static const absl::Time wall_start = absl::Now();
    return wall_start + absl::FromChrono(std::chrono::steady_clock::now() - steady_start);
  }
  static RealClock* Get() {
    static RealClock clock;
    return &clock;
  }
};

// How long a thread waiting for `deadline` by `clock` sleeps before it looks again: until the
// deadline on the wall clock; at most 50 ms on any other, which a test may move past the deadline
// during the wait. Whatever should end the wait sooner must wake the thread.
inline absl::Duration TimeToSleep(const Clock* clock, absl::Time deadline) {
  absl::Duration wait = deadline - clock->Now();
  return clock == RealClock::Get() ? wait : std::min(wait, absl::Milliseconds(50));
}

class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000)) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_;
};

}  // namespace dt
