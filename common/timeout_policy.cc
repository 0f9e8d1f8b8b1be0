#include "common/timeout_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/duration.h"

namespace dt {

absl::Status ValidateTimeouts(const CoordinatorTimeouts& t) {
  if (t.heartbeat_timeout < 2 * t.heartbeat_interval) {
    return absl::InvalidArgumentError(absl::StrCat("--heartbeat-timeout (", absl::FormatDuration(t.heartbeat_timeout),
                                                   ") must be at least twice --heartbeat-interval (",
                                                   absl::FormatDuration(t.heartbeat_interval),
                                                   "), or one late heartbeat would declare a rank dead"));
  }
  if (t.hang_timeout <= t.heartbeat_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hang-timeout (", absl::FormatDuration(t.hang_timeout), ") must exceed --heartbeat-timeout (",
        absl::FormatDuration(t.heartbeat_timeout), "), so a dead rank is reported as dead, not as a hang"));
  }
  return absl::OkStatus();
}

// What a coordinator restart may take beyond a heartbeat timeout: the drain, the start, loading
// every run from SQLite.
constexpr absl::Duration kCoordinatorRestartAllowance = absl::Seconds(30);

v1::TimeoutPolicy DerivePolicy(const CoordinatorTimeouts& t) {
  v1::TimeoutPolicy p;
  p.set_heartbeat_interval_ms(ToMillis(t.heartbeat_interval));
  p.set_heartbeat_timeout_ms(ToMillis(t.heartbeat_timeout));
  p.set_init_timeout_ms(ToMillis(t.rendezvous_timeout));
  p.set_hang_timeout_ms(ToMillis(t.hang_timeout));
  p.set_store_timeout_ms(ToMillis(t.rendezvous_timeout));
  p.set_barrier_timeout_ms(ToMillis(t.hang_timeout));
  p.set_collective_timeout_ms(
      ToMillis(t.hang_timeout + t.heartbeat_timeout + 3 * t.heartbeat_interval + kStackCaptureAllowance));
  p.set_checkpoint_lease_ms(ToMillis(t.hang_timeout));
  p.set_reconnect_timeout_ms(ToMillis(t.heartbeat_timeout + kCoordinatorRestartAllowance));
  return p;
}

absl::Duration HeartbeatPatience(const v1::TimeoutPolicy& policy) {
  return absl::Milliseconds(std::max(policy.reconnect_timeout_ms(), policy.heartbeat_timeout_ms()));
}

}  // namespace dt
