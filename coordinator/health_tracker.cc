#include "coordinator/health_tracker.h"

#include <algorithm>
#include <limits>

namespace dt {

HealthTracker::HealthTracker(int world_size, int64_t start_step, absl::Time now)
    : ranks_(world_size), start_step_(start_step), group_step_(start_step), last_progress_(now) {
  for (auto& r : ranks_) {
    r.last_heartbeat = now;
    r.step = start_step;
  }
}

void HealthTracker::Heartbeat(int rank, int64_t step, absl::Time now) {
  RankHealth& r = ranks_[rank];
  r.last_heartbeat = now;
  if (step > r.step) {
    r.step = step;
    RecomputeGroupStep(now);
  }
}

void HealthTracker::Finish(int rank) {
  if (ranks_[rank].finished) return;
  ranks_[rank].finished = true;
  ++finished_;
}

void HealthTracker::GraceAll(absl::Time now) {
  for (auto& r : ranks_) r.last_heartbeat = now;
  last_progress_ = now;
}

void HealthTracker::RecomputeGroupStep(absl::Time now) {
  int64_t lowest = std::numeric_limits<int64_t>::max();
  for (const auto& r : ranks_) {
    if (!r.finished) lowest = std::min(lowest, r.step);
  }
  if (lowest == std::numeric_limits<int64_t>::max()) return;
  if (lowest > group_step_) {
    group_step_ = lowest;
    last_progress_ = now;
  }
}

std::optional<HealthVerdict> HealthTracker::Check(absl::Time now, const HealthTimeouts& t) const {
  // A silent rank first: it explains a hang, not the other way round.
  int silent = -1;
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    const RankHealth& r = ranks_[i];
    if (r.finished || now - r.last_heartbeat <= t.heartbeat_timeout) continue;
    if (silent < 0 || r.last_heartbeat < ranks_[silent].last_heartbeat) silent = i;
  }
  if (silent >= 0) {
    const RankHealth& r = ranks_[silent];
    return HealthVerdict{HealthVerdict::Kind::kHeartbeatTimeout, silent, r.step, {},
                         r.last_heartbeat, t.heartbeat_timeout};
  }
  if (finished_ == static_cast<int>(ranks_.size())) return std::nullopt;
  absl::Duration limit = group_step_ > start_step_ ? t.hang_timeout : t.init_timeout;
  if (now - last_progress_ <= limit) return std::nullopt;
  HealthVerdict v{HealthVerdict::Kind::kHang, -1, group_step_, {}, last_progress_, limit};
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    if (!ranks_[i].finished && ranks_[i].step == group_step_) v.stuck_ranks.push_back(i);
  }
  if (!v.stuck_ranks.empty()) v.rank = v.stuck_ranks.front();
  return v;
}

}  // namespace dt
