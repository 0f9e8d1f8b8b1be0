// Losses of a run that was interrupted (a restart, a shrink, a resume at another world size) against
// the same run uninterrupted.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "dt/v1/metrics.pb.h"

namespace dt::testing {

// Every loss `got` holds (a step redone after a restart appears again) equals `want`'s at its step
// within `tolerance`, and every step from 1 to `steps` is there. `want` holds one loss per step.
inline void ExpectTheUninterruptedLosses(const std::vector<v1::MetricRecord>& want,
                                         const std::vector<v1::MetricRecord>& got, int steps, double tolerance) {
  ASSERT_EQ(want.size(), static_cast<size_t>(steps));
  ASSERT_GE(got.size(), static_cast<size_t>(steps));
  std::set<int64_t> seen;
  for (const v1::MetricRecord& m : got) {
    ASSERT_GE(m.step(), 1);
    ASSERT_LE(m.step(), steps);
    seen.insert(m.step());
    EXPECT_NEAR(m.value(), want[m.step() - 1].value(), tolerance) << "step " << m.step();
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(steps));
}

}  // namespace dt::testing
