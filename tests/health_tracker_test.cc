// Failure detection with a fake clock: silent ranks, hangs, the init window.
#include <gtest/gtest.h>

#include "coordinator/health_tracker.h"

namespace dt {
namespace {

const HealthTimeouts kLimits{absl::Seconds(30), absl::Minutes(10), absl::Minutes(20)};

TEST(HealthTracker, SilentRankIsDeclaredAfterTheHeartbeatTimeout) {
  absl::Time t0 = absl::FromUnixSeconds(1000);
  HealthTracker h(3, 0, t0);
  for (int s = 2; s <= 30; s += 2) {
    h.Heartbeat(0, 1, t0 + absl::Seconds(s));
    h.Heartbeat(2, 1, t0 + absl::Seconds(s));
  }
  EXPECT_FALSE(h.Check(t0 + absl::Seconds(30), kLimits).has_value());
  auto v = h.Check(t0 + absl::Seconds(31), kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, HealthVerdict::Kind::kHeartbeatTimeout);
  EXPECT_EQ(v->rank, 1);
  EXPECT_EQ(v->since, t0);
  EXPECT_TRUE(v->also_silent.empty());
}

TEST(HealthTracker, SeveralSilentRanksNameTheFirstToGoQuietAndListTheOthers) {
  absl::Time t0 = absl::FromUnixSeconds(1000);
  HealthTracker h(3, 0, t0);
  h.Heartbeat(0, 1, t0 + absl::Seconds(2));
  h.Heartbeat(2, 1, t0 + absl::Seconds(1));  // rank 1 last heard at t0, rank 2 at t0+1, rank 0 at t0+2
  auto v = h.Check(t0 + absl::Seconds(40), kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->rank, 1);
  ASSERT_EQ(v->also_silent.size(), 2u);
  EXPECT_EQ(v->also_silent[0].first, 2);
  EXPECT_EQ(v->also_silent[1].first, 0);
}

TEST(HealthTracker, HangIsNoStepAdvanceWhileEveryoneHeartbeats) {
  absl::Time t0 = absl::FromUnixSeconds(1000);
  HealthTracker h(2, 0, t0);
  absl::Time t = t0;
  // Train to step 5, then stall at 5 while heartbeating.
  for (int step = 1; step <= 5; ++step) {
    t += absl::Seconds(10);
    h.Heartbeat(0, step, t);
    h.Heartbeat(1, step, t);
  }
  absl::Time stalled_at = t;
  while (t < stalled_at + absl::Minutes(10)) {
    t += absl::Seconds(2);
    h.Heartbeat(0, 5, t);
    h.Heartbeat(1, 5, t);
    if (t <= stalled_at + absl::Minutes(10)) EXPECT_FALSE(h.Check(t, kLimits).has_value());
  }
  t += absl::Seconds(2);
  h.Heartbeat(0, 5, t);
  h.Heartbeat(1, 5, t);
  auto v = h.Check(t, kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, HealthVerdict::Kind::kHang);
  EXPECT_EQ(v->step, 5);
  EXPECT_EQ(v->stuck_ranks, (std::vector<int>{0, 1}));
}

TEST(HealthTracker, StragglerAtTheLowestStepIsNamed) {
  absl::Time t0 = absl::FromUnixSeconds(0);
  HealthTracker h(3, 0, t0);
  h.Heartbeat(0, 8, t0 + absl::Seconds(1));
  h.Heartbeat(1, 3, t0 + absl::Seconds(1));
  h.Heartbeat(2, 8, t0 + absl::Seconds(1));
  absl::Time later = t0 + absl::Seconds(1) + absl::Minutes(10) + absl::Seconds(1);
  for (int r = 0; r < 3; ++r) h.Heartbeat(r, r == 1 ? 3 : 8, later);
  auto v = h.Check(later, kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->stuck_ranks, std::vector<int>{1});
}

TEST(HealthTracker, InitWindowAppliesUntilTheFirstStep) {
  absl::Time t0 = absl::FromUnixSeconds(0);
  HealthTracker h(1, 100, t0);  // resumed at step 100
  absl::Time t = t0;
  while (t < t0 + absl::Minutes(19)) {
    t += absl::Seconds(5);
    h.Heartbeat(0, 100, t);
  }
  EXPECT_FALSE(h.Check(t, kLimits).has_value());  // still within the 20 min init window
  t += absl::Minutes(1) + absl::Seconds(5);
  h.Heartbeat(0, 100, t);
  auto v = h.Check(t, kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->timeout, absl::Minutes(20));
}

TEST(HealthTracker, FinishedRanksAreNotWatched) {
  absl::Time t0 = absl::FromUnixSeconds(0);
  HealthTracker h(2, 0, t0);
  h.Heartbeat(0, 10, t0 + absl::Seconds(1));
  h.Finish(0);
  h.Heartbeat(1, 10, t0 + absl::Minutes(1));
  EXPECT_FALSE(h.Check(t0 + absl::Minutes(1), kLimits).has_value());
  h.Finish(1);
  EXPECT_TRUE(h.all_finished());
  EXPECT_FALSE(h.Check(t0 + absl::Hours(5), kLimits).has_value());
}

}  // namespace
}  // namespace dt
