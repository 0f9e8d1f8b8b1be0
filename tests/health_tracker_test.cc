// Failure detection with a fake clock: silent ranks, hangs, the init window.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

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
    if (t <= stalled_at + absl::Minutes(10)) {
      EXPECT_FALSE(h.Check(t, kLimits).has_value());
    }
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

// A user's program under dtrun that never reports a step is alive, not hung; once it reports
// one (the dt module's dt.log), it is watched like dttrainer.
TEST(HealthTracker, AProgramThatReportsNoStepsIsWatchedForAHangOnlyOnceItReportsOne) {
  absl::Time t0 = absl::FromUnixSeconds(0);
  HealthTracker h(2, 0, t0, /*steps_expected=*/false);
  absl::Time t = t0;
  while (t < t0 + absl::Hours(1)) {
    t += absl::Seconds(5);
    h.Heartbeat(0, 0, t);
    h.Heartbeat(1, 0, t);
  }
  EXPECT_FALSE(h.Check(t, kLimits).has_value());
  h.Heartbeat(0, 1, t);
  h.Heartbeat(1, 1, t);
  absl::Time stalled_at = t;
  while (t < stalled_at + absl::Minutes(10) + absl::Seconds(5)) {
    t += absl::Seconds(5);
    h.Heartbeat(0, 1, t);
    h.Heartbeat(1, 1, t);
  }
  auto v = h.Check(t, kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, HealthVerdict::Kind::kHang);
  EXPECT_EQ(v->step, 1);
  // Silence is still death for such a program.
  HealthTracker quiet(1, 0, t0, /*steps_expected=*/false);
  auto dead = quiet.Check(t0 + absl::Seconds(31), kLimits);
  ASSERT_TRUE(dead.has_value());
  EXPECT_EQ(dead->kind, HealthVerdict::Kind::kHeartbeatTimeout);
}

TEST(HealthTracker, FinishedRanksAreNotWatched) {
  absl::Time t0 = absl::FromUnixSeconds(0);
  HealthTracker h(2, 0, t0);
  h.Heartbeat(0, 10, t0 + absl::Seconds(1));
  h.Finish(0, t0 + absl::Seconds(1));
  h.Heartbeat(1, 10, t0 + absl::Minutes(1));
  EXPECT_FALSE(h.Check(t0 + absl::Minutes(1), kLimits).has_value());
  h.Finish(1, t0 + absl::Minutes(1));
  EXPECT_TRUE(h.all_finished());
  EXPECT_FALSE(h.Check(t0 + absl::Hours(5), kLimits).has_value());
}

// The group's step is kept without a scan per heartbeat; whatever order ranks step, stop and
// finish in, it is the lowest step of the ranks still watched, and its progress time is when it
// last rose.
TEST(HealthTracker, TheGroupStepIsTheLowestWatchedStepWhateverTheOrderOfEvents) {
  absl::Time t0 = absl::FromUnixSeconds(0);
  const int n = 40;
  HealthTracker h(n, 5, t0);
  std::vector<int64_t> steps(n, 5);
  std::vector<bool> watched(n, true);
  uint64_t seed = 12345;
  auto next = [&seed](int bound) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int>((seed >> 33) % bound);
  };
  int64_t group = 5;
  absl::Time progress = t0;
  for (int event = 1; event <= 5000; ++event) {
    absl::Time now = t0 + absl::Seconds(event);
    int rank = next(n);
    int what = next(1000);
    if (what == 0) {
      h.Stop(rank, 15, now);
      watched[rank] = false;
    } else if (what == 1) {
      h.Finish(rank, now);
      watched[rank] = false;
    } else {
      int64_t step = steps[rank] + next(3);
      h.Heartbeat(rank, step, now);
      steps[rank] = std::max(steps[rank], step);
    }
    int64_t lowest = -1;
    for (int r = 0; r < n; ++r) {
      if (watched[r] && (lowest < 0 || steps[r] < lowest)) lowest = steps[r];
    }
    if (lowest > group) {
      group = lowest;
      progress = now;
    }
    ASSERT_EQ(h.group_step(), group) << "after event " << event;
    if (lowest < 0) break;  // every rank stopped or finished
  }
  EXPECT_GT(group, 5);
  ASSERT_GT(std::count(watched.begin(), watched.end(), true), 0);
  // A hang is judged from the last rise of the group step.
  const HealthTimeouts limits{absl::Hours(10), absl::Minutes(10), absl::Minutes(20)};
  EXPECT_FALSE(h.Check(progress + absl::Minutes(10), limits).has_value());
  std::optional<HealthVerdict> hang = h.Check(progress + absl::Minutes(10) + absl::Seconds(1), limits);
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->kind, HealthVerdict::Kind::kHang);
  EXPECT_EQ(hang->step, group);
}

// srun ends the step when one task dies: it SIGKILLs that task and SIGTERMs the others. The
// victims say they were stopped; the rank that really died is the one named, whatever order the
// two went quiet in.
TEST(HealthTracker, AStoppedRankIsAVictimAndTheSilentRankIsNamed) {
  absl::Time t0 = absl::FromUnixSeconds(1000);
  HealthTracker h(2, 0, t0);
  h.Heartbeat(0, 5, t0 + absl::Seconds(1));
  h.Heartbeat(1, 5, t0 + absl::Seconds(2));  // rank 1 is killed just after this heartbeat
  h.Stop(0, 15, t0 + absl::Seconds(2));      // rank 0 went quiet first, but by a stop signal
  EXPECT_TRUE(h.stopped(0));
  EXPECT_FALSE(h.Check(t0 + absl::Seconds(32), kLimits).has_value());
  auto v = h.Check(t0 + absl::Seconds(33), kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, HealthVerdict::Kind::kHeartbeatTimeout);
  EXPECT_EQ(v->rank, 1);
  EXPECT_TRUE(v->also_silent.empty());
  ASSERT_EQ(v->stopped.size(), 1u);
  EXPECT_EQ(v->stopped[0].rank, 0);
  EXPECT_EQ(v->stopped[0].signal, 15);
}

TEST(HealthTracker, ARankThatDiedJustAfterTheStopIsNamedNotTheStop) {
  absl::Time t0 = absl::FromUnixSeconds(1000);
  HealthTracker h(2, 0, t0);
  h.Stop(0, 15, t0 + absl::Seconds(1));
  h.Heartbeat(1, 3, t0 + absl::Seconds(2));  // in flight when rank 1 died
  // At t0+31 the stop is older than the timeout, but rank 1 has been quiet for 29 s: wait.
  EXPECT_FALSE(h.Check(t0 + absl::Seconds(31), kLimits).has_value());
  auto v = h.Check(t0 + absl::Seconds(33), kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, HealthVerdict::Kind::kHeartbeatTimeout);
  EXPECT_EQ(v->rank, 1);
}

TEST(HealthTracker, AStopNothingElseExplainsEndsTheGenerationAfterTheHeartbeatTimeout) {
  absl::Time t0 = absl::FromUnixSeconds(1000);
  HealthTracker h(2, 0, t0);
  h.Stop(1, 15, t0 + absl::Seconds(5));
  absl::Time t = t0;
  while (t < t0 + absl::Seconds(35)) {
    t += absl::Seconds(1);
    h.Heartbeat(0, 1, t);
    EXPECT_FALSE(h.Check(t, kLimits).has_value()) << "at " << t - t0;
  }
  t += absl::Seconds(1);
  h.Heartbeat(0, 1, t);
  auto v = h.Check(t, kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, HealthVerdict::Kind::kStopped);
  EXPECT_EQ(v->rank, 1);  // rank 0 still trains: the stop of rank 1 is the cause
  EXPECT_EQ(v->since, t0 + absl::Seconds(5));
}

TEST(HealthTracker, EveryRankStoppedNamesNoRank) {
  absl::Time t0 = absl::FromUnixSeconds(1000);
  HealthTracker h(2, 0, t0);
  h.Stop(1, 15, t0 + absl::Seconds(1));
  h.Stop(0, 2, t0 + absl::Seconds(2));
  h.Stop(0, 9, t0 + absl::Seconds(3));  // the first report counts
  auto v = h.Check(t0 + absl::Seconds(40), kLimits);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, HealthVerdict::Kind::kStopped);
  EXPECT_EQ(v->rank, -1);  // the scheduler stopped the whole job
  ASSERT_EQ(v->stopped.size(), 2u);
  EXPECT_EQ(v->stopped[0].rank, 1);
  EXPECT_EQ(v->stopped[1].rank, 0);
  EXPECT_EQ(v->stopped[1].signal, 2);
}

TEST(HealthTracker, AStoppedRankDoesNotHoldBackTheGroupStepOrCountAsStuck) {
  absl::Time t0 = absl::FromUnixSeconds(0);
  HealthTracker h(3, 0, t0);
  absl::Time t = t0 + absl::Seconds(1);
  for (int r = 0; r < 3; ++r) h.Heartbeat(r, 1, t);
  h.Stop(2, 15, t);
  // Ranks 0 and 1 go on to step 9 and then stall there: the hang names them, not rank 2 at 1.
  for (int step = 2; step <= 9; ++step) {
    t += absl::Seconds(1);
    h.Heartbeat(0, step, t);
    h.Heartbeat(1, step, t);
  }
  EXPECT_EQ(h.group_step(), 9);
  // (The stop would end the generation after the heartbeat timeout; the hang is checked first
  // only while the stop is recent, so look inside that window with a short hang timeout.)
  HealthTimeouts short_hang{absl::Seconds(30), absl::Seconds(3), absl::Minutes(20)};
  t += absl::Seconds(4);
  h.Heartbeat(0, 9, t);
  h.Heartbeat(1, 9, t);
  auto v = h.Check(t, short_hang);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->kind, HealthVerdict::Kind::kHang);
  EXPECT_EQ(v->stuck_ranks, (std::vector<int>{0, 1}));
  ASSERT_EQ(v->stopped.size(), 1u);
}

}  // namespace
}  // namespace dt
