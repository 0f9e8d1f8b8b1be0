// One limit shared by many holders, taken and given back without a lock: the bytes of every
// run's store (--store-bytes-total), the ranks of every run not yet ended (--max-ranks).
#pragma once

#include <atomic>
#include <cstdint>

namespace dt {

class SharedBudget {
 public:
  explicit SharedBudget(int64_t limit) : limit_(limit) {}
  // Takes `amount` unless that would pass the limit; nothing is taken then.
  bool TryCharge(int64_t amount);
  // Takes `amount` whatever the limit (what was held before a restart keeps its place).
  void Charge(int64_t amount) { used_.fetch_add(amount, std::memory_order_relaxed); }
  void Release(int64_t amount) { used_.fetch_sub(amount, std::memory_order_relaxed); }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

}  // namespace dt
