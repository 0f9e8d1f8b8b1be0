// One policy for every timeout of a run, so that none fires before the one that should name the
// cause: the coordinator's hang watchdog (which names the stuck ranks) fires, and tells every
// rank through the heartbeat reply, before the process group's collective timeout would throw
// inside a collective with no idea who is missing.
#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dt/v1/common.pb.h"

namespace dt {

struct CoordinatorTimeouts {
  absl::Duration heartbeat_interval = absl::Seconds(2);
  absl::Duration heartbeat_timeout = absl::Seconds(30);
  absl::Duration hang_timeout = absl::Minutes(10);
  absl::Duration rendezvous_timeout = absl::Minutes(10);  // also the init timeout
};

// What a hang's stack capture may take once the ranks are asked (the capture on each node is
// bounded by 5 s; the rest is the answers' way back): the capture window is a heartbeat interval
// (to ask) plus this.
inline constexpr absl::Duration kStackCaptureAllowance = absl::Seconds(8);

// INVALID_ARGUMENT unless heartbeat_timeout ≥ 2 × heartbeat_interval and the hang timeout exceeds
// the heartbeat timeout (a hang must not be reported before a silent rank would be).
absl::Status ValidateTimeouts(const CoordinatorTimeouts& t);

// The policy sent to trainers:
//   init = store = rendezvous timeout (set-up may wait for the slowest process to start);
//   barrier = hang timeout; checkpoint lease = hang timeout;
//   collective = hang + heartbeat timeout + 2 heartbeat intervals + the capture window
//   (a hang's stacks are captured while the collective still waits, before the group stops).
v1::TimeoutPolicy DerivePolicy(const CoordinatorTimeouts& t);

// How long whoever heartbeats for a rank goes on trying to reach the coordinator before it stops
// the rank: the longer of the reconnect and heartbeat timeouts, to ride out a coordinator restart.
absl::Duration HeartbeatPatience(const v1::TimeoutPolicy& policy);

}  // namespace dt
