#include "coordinator/file_work.h"

#include <utility>

namespace dt {

FileWorkQueue::FileWorkQueue(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Work(); });
}

FileWorkQueue::~FileWorkQueue() {
  Drain();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void FileWorkQueue::Post(const std::string& key, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  ++unfinished_;
  std::deque<std::function<void()>>& queue = pending_[key];
  queue.push_back(std::move(task));
  if (queue.size() == 1 && !running_.contains(key)) ready_.push_back(key);
}

void FileWorkQueue::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &unfinished_));
}

void FileWorkQueue::Work() {
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !ready_.empty(); };
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(&has_work));
    if (ready_.empty()) return;  // stopping, and nothing left
    std::string key = std::move(ready_.front());
    ready_.pop_front();
    auto it = pending_.find(key);
    std::function<void()> task = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) pending_.erase(it);
    running_.insert(key);
    mu_.Unlock();
    task();
    mu_.Lock();
    running_.erase(key);
    if (pending_.contains(key)) ready_.push_back(key);
    --unfinished_;
  }
}

}  // namespace dt
