// Linear warmup to the peak learning rate, then cosine decay to the minimum at the last step.
#pragma once

#include <cstdint>

namespace dt {

struct LrSchedule {
  double peak = 3e-4;
  double min = 3e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  // The rate for optimizer step `step` (1-based: the step being taken).
  double At(int64_t step) const;
};

}  // namespace dt
