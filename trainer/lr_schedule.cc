#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace dt {

double LrSchedule::At(int64_t step) const {
  if (warmup_steps > 0 && step <= warmup_steps) return peak * static_cast<double>(step) / warmup_steps;
  if (total_steps <= warmup_steps) return peak;
  double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  progress = std::clamp(progress, 0.0, 1.0);
  return min + 0.5 * (peak - min) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace dt
