#include "coordinator/health_tracker.h"

#include <algorithm>
#include <limits>

namespace dt {

HealthTracker::HealthTracker(int world_size, int64_t start_step, absl::Time now, bool steps_expected)
    : ranks_(world_size),
      start_step_(start_step),
      group_step_(start_step),
      last_progress_(now),
      steps_expected_(steps_expected),
      at_group_step_(world_size) {
  for (auto& r : ranks_) {
    r.last_heartbeat = now;
    r.last_step_at = now;
    r.step = start_step;
  }
}

void HealthTracker::SetIdle(int rank, absl::Duration idle, absl::Time now) {
  ranks_[rank].idle_since = idle > absl::ZeroDuration() ? now - idle : absl::InfiniteFuture();
}

void HealthTracker::Heartbeat(int rank, int64_t step, absl::Time now) {
  RankHealth& r = ranks_[rank];
  r.last_heartbeat = now;
  if (step > r.step) {
    const bool left_group_step = r.watched() && r.step == group_step_;
    r.step = step;
    r.last_step_at = now;
    step_reported_ = true;
    if (left_group_step) LeaveGroupStep(now);
  }
}

void HealthTracker::LeaveGroupStep(absl::Time now) {
  if (--at_group_step_ == 0) RecomputeGroupStep(now);
}

void HealthTracker::Finish(int rank, absl::Time now) {
  RankHealth& r = ranks_[rank];
  if (r.finished) return;
  const bool left_group_step = r.watched() && r.step == group_step_;
  r.finished = true;
  ++finished_;
  if (left_group_step) LeaveGroupStep(now);
}

void HealthTracker::Stop(int rank, int signal, absl::Time now) {
  RankHealth& r = ranks_[rank];
  if (r.stopped || r.finished) return;
  const bool left_group_step = r.step == group_step_;
  r.stopped = true;
  r.signal = signal;
  r.stopped_at = now;
  if (left_group_step) LeaveGroupStep(now);
}

std::vector<StoppedRank> HealthTracker::StoppedRanks() const {
  std::vector<StoppedRank> out;
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    if (ranks_[i].stopped) out.push_back({i, ranks_[i].signal, ranks_[i].stopped_at});
  }
  std::stable_sort(out.begin(), out.end(), [](const StoppedRank& a, const StoppedRank& b) { return a.when < b.when; });
  return out;
}

void HealthTracker::GraceAll(absl::Time now) {
  for (auto& r : ranks_) r.last_heartbeat = now;
  last_progress_ = now;
}

std::optional<HealthVerdict> HealthTracker::CheckIdle(absl::Time now, const HealthTimeouts& t) const {
  if (t.idle_timeout <= absl::ZeroDuration()) return std::nullopt;
  std::vector<std::pair<absl::Time, int>> idle;  // since when, rank
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    const RankHealth& r = ranks_[i];
    if (!r.watched() || r.idle_since == absl::InfiniteFuture()) continue;
    absl::Time since = std::max(r.idle_since, r.last_step_at);
    if (now - since >= t.idle_timeout) idle.emplace_back(since, i);
  }
  if (idle.empty()) return std::nullopt;
  std::sort(idle.begin(), idle.end());
  HealthVerdict v{HealthVerdict::Kind::kIdle,
                  idle.front().second,
                  ranks_[idle.front().second].step,
                  {},
                  idle.front().first,
                  t.idle_timeout,
                  {},
                  {}};
  for (const auto& [since, rank] : idle) v.idle_ranks.push_back(rank);
  return v;
}

void HealthTracker::RecomputeGroupStep(absl::Time now) {
  int64_t lowest = std::numeric_limits<int64_t>::max();
  int at_lowest = 0;
  for (const auto& r : ranks_) {
    if (!r.watched()) continue;
    if (r.step < lowest) {
      lowest = r.step;
      at_lowest = 0;
    }
    if (r.step == lowest) ++at_lowest;
  }
  if (lowest == std::numeric_limits<int64_t>::max()) return;  // nobody is watched any more
  at_group_step_ = at_lowest;
  if (lowest > group_step_) {
    group_step_ = lowest;
    last_progress_ = now;
  }
}

std::optional<HealthVerdict> HealthTracker::Check(absl::Time now, const HealthTimeouts& t) const {
  std::vector<StoppedRank> stopped = StoppedRanks();
  // A silent rank first: it explains a hang, and the stops srun makes once one task died.
  std::vector<std::pair<absl::Time, int>> silent;
  int watched = 0;
  bool some_quiet = false;  // a watched rank quiet for over half the heartbeat timeout
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    const RankHealth& r = ranks_[i];
    if (!r.watched()) continue;
    ++watched;
    if (now - r.last_heartbeat > t.heartbeat_timeout) silent.emplace_back(r.last_heartbeat, i);
    if (now - r.last_heartbeat > t.heartbeat_timeout / 2) some_quiet = true;
  }
  if (!silent.empty()) {
    std::sort(silent.begin(), silent.end());
    int first = silent.front().second;
    const RankHealth& r = ranks_[first];
    HealthVerdict v{
        HealthVerdict::Kind::kHeartbeatTimeout, first, r.step, {}, r.last_heartbeat, t.heartbeat_timeout, {}, {}};
    for (size_t k = 1; k < silent.size(); ++k) v.also_silent.emplace_back(silent[k].second, silent[k].first);
    v.stopped = std::move(stopped);
    return v;
  }
  // A stop that nothing else explained within the heartbeat timeout: the stop is the cause —
  // unless a rank has been quiet for over half that timeout: it may have died just after the stop
  // (its last heartbeat was in flight), and its silence is then the cause.
  if (!stopped.empty() && !some_quiet && now - stopped.front().when > t.heartbeat_timeout) {
    const StoppedRank& first = stopped.front();
    HealthVerdict v{HealthVerdict::Kind::kStopped,
                    watched == 0 ? -1 : first.rank,
                    ranks_[first.rank].step,
                    {},
                    first.when,
                    t.heartbeat_timeout,
                    {},
                    {}};
    v.stopped = std::move(stopped);
    return v;
  }
  if (watched == 0) return std::nullopt;
  if (std::optional<HealthVerdict> idle = CheckIdle(now, t)) {
    idle->stopped = std::move(stopped);
    return idle;
  }
  if (!steps_expected_ && !step_reported_) return std::nullopt;
  absl::Duration limit = group_step_ > start_step_ ? t.hang_timeout : t.init_timeout;
  if (now - last_progress_ <= limit) return std::nullopt;
  HealthVerdict v{HealthVerdict::Kind::kHang, -1, group_step_, {}, last_progress_, limit, {}, {}};
  for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
    if (ranks_[i].watched() && ranks_[i].step == group_step_) v.stuck_ranks.push_back(i);
  }
  if (!v.stuck_ranks.empty()) v.rank = v.stuck_ranks.front();
  v.stopped = std::move(stopped);
  return v;
}

}  // namespace dt
