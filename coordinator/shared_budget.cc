#include "coordinator/shared_budget.h"

namespace dt {

bool SharedBudget::TryCharge(int64_t amount) {
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (used + amount > limit_) return false;
  } while (!used_.compare_exchange_weak(used, used + amount, std::memory_order_relaxed));
  return true;
}

}  // namespace dt
