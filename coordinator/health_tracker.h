// Failure detection for one running generation, driven by heartbeats and a clock:
// - a rank silent for the heartbeat timeout is dead;
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
};

struct HealthVerdict {
  enum class Kind { kHeartbeatTimeout, kHang };
  Kind kind;
  int rank = -1;         // the silent rank, or the first rank at the lowest step for a hang
  int64_t step = 0;
  std::vector<int> stuck_ranks;  // hang: ranks at the lowest step
  absl::Time since;      // last heartbeat, or last progress
  absl::Duration timeout;
  // Heartbeat timeout: the other silent ranks, longest silent first (a scheduler that ends a job
  // step kills every rank within moments: the first to go silent is the likely cause).
  std::vector<std::pair<int, absl::Time>> also_silent;
};

class HealthTracker {
 public:
  HealthTracker(int world_size, int64_t start_step, absl::Time now);

  void Heartbeat(int rank, int64_t step, absl::Time now);
  // A rank that left with success is no longer watched.
  void Finish(int rank);
  // After a coordinator restart every rank gets a full heartbeat timeout to reconnect.
  void GraceAll(absl::Time now);

  std::optional<HealthVerdict> Check(absl::Time now, const HealthTimeouts& t) const;

  // Lowest step among ranks still training (the group's progress).
  int64_t group_step() const { return group_step_; }
  int64_t step(int rank) const { return ranks_[rank].step; }
  absl::Time last_heartbeat(int rank) const { return ranks_[rank].last_heartbeat; }
  bool finished(int rank) const { return ranks_[rank].finished; }
  bool all_finished() const { return finished_ == static_cast<int>(ranks_.size()); }

 private:
  struct RankHealth {
    absl::Time last_heartbeat;
    int64_t step = 0;
    bool finished = false;
  };
  void RecomputeGroupStep(absl::Time now);

  std::vector<RankHealth> ranks_;
  int64_t start_step_;
  int64_t group_step_;
  absl::Time last_progress_;
  int finished_ = 0;
};

}  // namespace dt
