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
  std::vector<std::pair<absl::Time, int>> silent;
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    const RankHealth& r = ranks_[i];
    if (!r.finished && now - r.last_heartbeat > t.heartbeat_timeout) silent.emplace_back(r.last_heartbeat, i);
  }
  if (!silent.empty()) {
    std::sort(silent.begin(), silent.end());
    int first = silent.front().second;
    const RankHealth& r = ranks_[first];
    HealthVerdict v{HealthVerdict::Kind::kHeartbeatTimeout, first, r.step, {}, r.last_heartbeat, t.heartbeat_timeout};
    for (size_t k = 1; k < silent.size(); ++k) v.also_silent.emplace_back(silent[k].second, silent[k].first);
    return v;
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
