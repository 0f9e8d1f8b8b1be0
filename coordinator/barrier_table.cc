#include "coordinator/barrier_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/duration.h"
#include "common/limits.h"
#include "common/names.h"

namespace dt {

BarrierTable::BarrierTable(std::string scope, int world_size, const Clock* clock, TimerQueue* timers,
                           DescribeRank describe_rank, ScheduleExpiry schedule_expiry, size_t max_names)
    : scope_(std::move(scope)),
      world_size_(world_size),
      max_names_(max_names),
      clock_(clock),
      timers_(timers),
      describe_rank_(std::move(describe_rank)),
      schedule_expiry_(std::move(schedule_expiry)) {}

BarrierTable::~BarrierTable() {
  for (auto& [name, b] : barriers_) {
    if (b.open && b.pending.timer != 0) timers_->Cancel(b.pending.timer);
  }
}

void BarrierTable::Arrive(int rank, const std::string& name, uint64_t sequence, absl::Duration timeout,
                          PendingPtr<BarrierRelease> reply, Deferred& deferred) {
  if (absl::Status s = ValidateLabel("barrier name", name); !s.ok()) {
    deferred.Complete<BarrierRelease>(reply, s);
    return;
  }
  if (rank < 0 || rank >= world_size_) {
    deferred.Complete<BarrierRelease>(reply, absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside 0..",
                                                                                     world_size_ - 1, " of ", scope_)));
    return;
  }
  if (!aborted_.ok()) {
    deferred.Complete<BarrierRelease>(reply, aborted_);
    return;
  }
  if (barriers_.size() >= max_names_ && !barriers_.contains(name)) {
    // Each name keeps its instance count for the generation's life: unbounded names would be
    // unbounded memory.
    deferred.Complete<BarrierRelease>(
        reply, absl::ResourceExhaustedError(absl::StrCat(
                   scope_, " already has ", barriers_.size(), " barrier names, the most a generation may use; ",
                   "reuse a name instead of making one per step (a rank's k-th arrival at a name joins its k-th "
                   "instance)")));
    return;
  }
  Barrier& b = barriers_[name];
  if (sequence != 0 && sequence <= b.released) {
    deferred.Complete<BarrierRelease>(reply, BarrierRelease{sequence, absl::ZeroDuration()});
    return;
  }
  if (sequence != 0 && sequence > b.released + 1) {
    deferred.Complete<BarrierRelease>(
        reply, absl::InvalidArgumentError(absl::StrCat("rank ", rank, " arrived at instance ", sequence, " of barrier ",
                                                       Quote(name), " in ", scope_, " but only ", b.released,
                                                       " instances were released")));
    return;
  }
  absl::Time now = clock_->Now();
  if (!b.open) {
    b.open = true;
    b.pending = Instance{};
    b.pending.sequence = b.released + 1;
    b.pending.first_arrival = now;
    b.pending.timeout = timeout;
    b.pending.timer = schedule_expiry_(now + timeout, name, b.pending.sequence);
  }
  auto [it, inserted] = b.pending.arrived.try_emplace(rank, reply, now);
  if (!inserted) {
    // A retry of this rank (its earlier call was cancelled or lost): the new call replaces it.
    deferred.Complete<BarrierRelease>(
        it->second.first,
        absl::CancelledError(absl::StrCat("replaced by a retry of rank ", rank, " at barrier ", Quote(name))));
    it->second.first = reply;
  }
  if (static_cast<int>(b.pending.arrived.size()) < world_size_) return;

  // Everyone is here: release.
  if (b.pending.timer != 0) timers_->Cancel(b.pending.timer);
  for (auto& [r, arrival] : b.pending.arrived) {
    deferred.Complete<BarrierRelease>(arrival.first, BarrierRelease{b.pending.sequence, now - arrival.second});
  }
  b.released = b.pending.sequence;
  b.open = false;
  b.pending = Instance{};
}

void BarrierTable::ArriveRelayed(int rank, const std::string& name, uint64_t sequence, absl::Duration timeout,
                                 Deferred& deferred) {
  auto b = barriers_.find(name);
  if (b != barriers_.end() && b->second.open && (sequence == 0 || b->second.pending.sequence == sequence) &&
      b->second.pending.arrived.count(rank) != 0) {
    return;  // its own arrival (perhaps one it waits on for an answer) stays
  }
  Arrive(rank, name, sequence, timeout, MakePending<BarrierRelease>([](absl::StatusOr<BarrierRelease>) {}), deferred);
}

void BarrierTable::Expire(const std::string& name, uint64_t sequence, Deferred& deferred) {
  auto found = barriers_.find(name);
  if (found == barriers_.end()) return;
  Barrier& b = found->second;
  if (!b.open || b.pending.sequence != sequence) return;
  std::vector<std::string> missing;
  for (int r = 0; r < world_size_; ++r) {
    if (b.pending.arrived.count(r)) continue;
    if (missing.size() == 16) {
      missing.push_back("…");
      break;
    }
    missing.push_back(describe_rank_(r));
  }
  int missing_count = world_size_ - static_cast<int>(b.pending.arrived.size());
  absl::Status status = absl::DeadlineExceededError(
      absl::StrCat("barrier ", Quote(name), " (instance ", sequence, ") of ", scope_, " timed out after ",
                   absl::FormatDuration(b.pending.timeout), ": ", b.pending.arrived.size(), " of ", world_size_,
                   " ranks arrived; missing ", missing_count, ": ", absl::StrJoin(missing, ", ")));
  for (auto& [r, arrival] : b.pending.arrived) {
    deferred.Complete<BarrierRelease>(arrival.first, status);
  }
  // The instance is abandoned; a later arrival starts it afresh with a new timeout.
  b.open = false;
  b.pending = Instance{};
}

void BarrierTable::Abort(const absl::Status& cause, Deferred& deferred) {
  if (!aborted_.ok()) return;
  aborted_ = cause;
  for (auto& [name, b] : barriers_) {
    if (!b.open) continue;
    if (b.pending.timer != 0) timers_->Cancel(b.pending.timer);
    for (auto& [r, arrival] : b.pending.arrived) {
      deferred.Complete<BarrierRelease>(arrival.first, cause);
    }
    b.open = false;
    b.pending = Instance{};
  }
}

std::vector<v1::OpenBarrier> BarrierTable::Open() const {
  std::vector<v1::OpenBarrier> out;
  for (const auto& [name, b] : barriers_) {
    if (!b.open) continue;
    v1::OpenBarrier& o = out.emplace_back();
    o.set_name(name);
    o.set_sequence(b.pending.sequence);
    o.set_arrived(static_cast<int>(b.pending.arrived.size()));
    for (int r = 0; r < world_size_ && o.missing_ranks_size() < 16; ++r) {
      if (!b.pending.arrived.count(r)) o.add_missing_ranks(r);
    }
    o.mutable_first_arrival()->set_seconds(absl::ToUnixSeconds(b.pending.first_arrival));
  }
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.name() < y.name(); });
  return out;
}

}  // namespace dt
