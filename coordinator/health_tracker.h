// Failure detection for one running generation, driven by heartbeats and a clock:
// - a rank silent for the heartbeat timeout is dead;
// - a rank stopped by a signal from outside (srun ends the step when another task dies) is a
//   victim: it is not watched for silence, so the rank that really failed is the one named. A
//   stop that nothing else explains within the heartbeat timeout (while every other rank
//   heartbeats) ends the generation itself;
// - a group in which no rank's step advanced for the hang timeout is hung (alive but stuck in a
//   collective: the failure heartbeats alone never catch). Until the first step after start the
//   init timeout applies instead, since set-up (process group, data) legitimately takes longer.
// Not thread-safe: used under the run's lock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace dt {

struct HealthTimeouts {
  absl::Duration heartbeat_timeout;
  absl::Duration hang_timeout;
  absl::Duration init_timeout;
  // A rank whose processes neither printed nor used CPU, and that reported no step, for this long
  // is hung (users' programs under dtrun, which measures the idleness). Zero: not watched.
  absl::Duration idle_timeout = absl::ZeroDuration();
};

struct StoppedRank {
  int rank = -1;
  int signal = 0;
  absl::Time when;
};

struct HealthVerdict {
  enum class Kind { kHeartbeatTimeout, kHang, kStopped, kIdle };
  Kind kind;
  // The silent rank; the first rank at the lowest step for a hang; for kStopped the first rank
  // stopped, or -1 when every rank still training was stopped (the scheduler stopped the job).
  int rank = -1;
  int64_t step = 0;
  std::vector<int> stuck_ranks;  // hang: ranks at the lowest step
  absl::Time since;              // last heartbeat, or last progress
  absl::Duration timeout;
  // Heartbeat timeout: the other silent ranks, longest silent first (a scheduler that ends a job
  // step kills every rank within moments: the first to go silent is the likely cause).
  std::vector<std::pair<int, absl::Time>> also_silent;
  // Ranks stopped by a signal, first stopped first (for kStopped, including `rank`).
  std::vector<StoppedRank> stopped;
  // kIdle: the idle ranks, longest idle first (`rank` is the first; `since` when it went idle).
  std::vector<int> idle_ranks;
};

class HealthTracker {
 public:
  // `steps_expected`: the program reports its steps (dttrainer does). A user's program under
  // dtrun may never report one; its group is then watched for a hang only once a rank has.
  HealthTracker(int world_size, int64_t start_step, absl::Time now, bool steps_expected = true);

  void Heartbeat(int rank, int64_t step, absl::Time now);
  // How long the rank's processes have been idle, as its agent measured it (zero: busy).
  void SetIdle(int rank, absl::Duration idle, absl::Time now);
  // A rank that left with success is no longer watched.
  void Finish(int rank, absl::Time now);
  // A rank stopped by a signal from outside: no longer watched for silence or progress. The
  // first report counts.
  void Stop(int rank, int signal, absl::Time now);
  // After a coordinator restart every rank gets a full heartbeat timeout to reconnect.
  void GraceAll(absl::Time now);

  std::optional<HealthVerdict> Check(absl::Time now, const HealthTimeouts& t) const;

  // Lowest step among ranks still training (the group's progress).
  int64_t group_step() const { return group_step_; }
  int64_t step(int rank) const { return ranks_[rank].step; }
  absl::Time last_heartbeat(int rank) const { return ranks_[rank].last_heartbeat; }
  bool finished(int rank) const { return ranks_[rank].finished; }
  bool stopped(int rank) const { return ranks_[rank].stopped; }
  // Ranks stopped by a signal, first stopped first.
  std::vector<StoppedRank> StoppedRanks() const;
  bool all_finished() const { return finished_ == static_cast<int>(ranks_.size()); }
  int64_t start_step() const { return start_step_; }
  // Some rank reported a step past the start.
  bool step_reported() const { return step_reported_; }

 private:
  struct RankHealth {
    absl::Time last_heartbeat;
    int64_t step = 0;
    bool finished = false;
    bool stopped = false;
    int signal = 0;
    absl::Time stopped_at;
    absl::Time idle_since = absl::InfiniteFuture();
    absl::Time last_step_at;  // its last step advance (or the generation's start)
    // Neither finished nor stopped: still expected to heartbeat and make progress.
    bool watched() const { return !finished && !stopped; }
  };
  // The group's step is the lowest of the watched ranks' steps. Steps only grow and ranks only
  // leave the watched set, so it changes only when the last rank at it moves on or leaves: that
  // rank's heartbeat rescans (once per group step), every other heartbeat costs O(1).
  void LeaveGroupStep(absl::Time now);
  void RecomputeGroupStep(absl::Time now);
  std::optional<HealthVerdict> CheckIdle(absl::Time now, const HealthTimeouts& t) const;

  std::vector<RankHealth> ranks_;
  int64_t start_step_;
  int64_t group_step_;
  absl::Time last_progress_;
  bool steps_expected_;
  bool step_reported_ = false;  // some rank reported a step past start_step_
  int finished_ = 0;
  int at_group_step_;  // watched ranks whose step is group_step_
};

}  // namespace dt
