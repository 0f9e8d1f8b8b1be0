#include "coordinator/timer_queue.h"

namespace dt {

TimerQueue::TimerQueue(const Clock* clock) : clock_(clock) {}

TimerQueue::~TimerQueue() { Stop(); }

TimerQueue::Id TimerQueue::Schedule(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  Id id = next_id_++;
  if (heap_.empty() || when < heap_.top().when) wake_ = true;
  heap_.push(Entry{when, id});
  fns_.emplace(id, std::move(fn));
  return id;
}

bool TimerQueue::Cancel(Id id) {
  absl::MutexLock lock(&mu_);
  // The heap entry stays and is skipped when it surfaces.
  return fns_.erase(id) > 0;
}

size_t TimerQueue::size() const {
  absl::MutexLock lock(&mu_);
  return fns_.size();
}

int TimerQueue::RunDue() {
  std::vector<std::function<void()>> due;
  {
    absl::MutexLock lock(&mu_);
    absl::Time now = clock_->Now();
    while (!heap_.empty() && heap_.top().when <= now) {
      Id id = heap_.top().id;
      heap_.pop();
      auto it = fns_.find(id);
      if (it == fns_.end()) continue;  // cancelled
      due.push_back(std::move(it->second));
      fns_.erase(it);
    }
    // Drop cancelled entries at the top so the heap does not grow with them.
    while (!heap_.empty() && !fns_.contains(heap_.top().id)) heap_.pop();
  }
  for (auto& fn : due) fn();
  return static_cast<int>(due.size());
}

void TimerQueue::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void TimerQueue::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void TimerQueue::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      absl::Time next = heap_.empty() ? absl::InfiniteFuture() : heap_.top().when;
      // Wake at the next deadline or when Schedule() adds an earlier one, so an idle coordinator's
      // timer thread sleeps.
      absl::Duration wait = TimeToSleep(clock_, next);
      if (wait > absl::ZeroDuration()) {
        auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || wake_; };
        mu_.AwaitWithTimeout(absl::Condition(&woken), wait);
        if (stopping_) return;
      }
      wake_ = false;
    }
    RunDue();
  }
}

}  // namespace dt
