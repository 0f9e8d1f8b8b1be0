// The coordinator's timer thread on the wall clock: it sleeps until the earliest deadline (not
// in 50 ms polls), so what wakes it early must be a Schedule() of an earlier one, or Stop().
#include <gtest/gtest.h>

#include <atomic>

#include "absl/synchronization/notification.h"
#include "coordinator/timer_queue.h"

namespace dt {
namespace {

TEST(TimerQueueTest, AnEarlierDeadlineWakesAThreadSleepingTowardsALaterOne) {
  TimerQueue timers(RealClock::Get());
  timers.Start();
  std::atomic<bool> late_ran{false};
  timers.Schedule(RealClock::Get()->Now() + absl::Hours(1), [&] { late_ran = true; });
  absl::Notification early;
  // Whether the thread is already asleep towards the hour or not, the earlier deadline runs.
  absl::SleepFor(absl::Milliseconds(20));
  timers.Schedule(RealClock::Get()->Now() + absl::Milliseconds(10), [&] { early.Notify(); });
  EXPECT_TRUE(early.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(late_ran);
  EXPECT_EQ(timers.size(), 1u);  // the hour's timer is still pending
}

TEST(TimerQueueTest, AnIdleQueueWakesForItsFirstTimerAndStopsWithNonePending) {
  TimerQueue timers(RealClock::Get());
  timers.Start();
  absl::Notification ran;
  // Whether the thread is already asleep with no deadline or not, the first timer runs.
  absl::SleepFor(absl::Milliseconds(20));
  timers.Schedule(RealClock::Get()->Now(), [&] { ran.Notify(); });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // Nothing pending: the thread sleeps with no deadline, and Stop() still ends it.
  timers.Stop();
  EXPECT_EQ(timers.size(), 0u);
}

TEST(TimerQueueTest, ACancelledTimerNeverRuns) {
  TimerQueue timers(RealClock::Get());
  // Both are scheduled, and one cancelled, before the thread starts: the cancel cannot lose a race.
  std::atomic<bool> cancelled_ran{false};
  TimerQueue::Id id = timers.Schedule(RealClock::Get()->Now() + absl::Milliseconds(30), [&] { cancelled_ran = true; });
  ASSERT_TRUE(timers.Cancel(id));
  absl::Notification after;
  timers.Schedule(RealClock::Get()->Now() + absl::Milliseconds(60), [&] { after.Notify(); });
  timers.Start();
  ASSERT_TRUE(after.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(cancelled_ran);  // its deadline passed before the later timer's
}

}  // namespace
}  // namespace dt
