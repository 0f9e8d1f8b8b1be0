// The launcher's RunFollower against the dtcoord binary: every change of a run arrives through
// one WatchRun stream and wakes a thread waiting for SIGCHLD as the launcher's loop does, the
// stream is opened again after a kill -9 of the coordinator, and a refused token ends it.
#include "client/dtctl/run_follower.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "client/agent.h"
#include "common/subprocess.h"
#include "tests/test_util.h"

namespace dt {
namespace {

using ctl::RunFollower;

class RunFollowerTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_;
  testing::CoordinatorProcess coord_{tmp_.Sub("state")};

  v1::SubmitRunResponse Submit(const std::string& name, int ranks) {
    return coord_.Submit(testing::MakeSpec(name, tmp_.Sub("runs"), 1, ranks, /*max_restarts=*/0));
  }

  // Waits for a snapshot (taken from `follower`) in which `done` holds; the snapshots taken on the
  // way are appended to `seen`.
  static bool WaitForSnapshot(RunFollower& follower, const std::function<bool(const v1::Run&)>& done,
                              std::vector<v1::Run>& seen) {
    return testing::WaitFor(
        [&] {
          std::optional<v1::Run> r = follower.Take();
          if (!r) return false;
          seen.push_back(*r);
          return done(*r);
        },
        absl::Seconds(20));
  }
};

// As in the launcher (main() below blocks SIGCHLD before any thread exists): the follower's
// SIGCHLD wakes the thread waiting in WaitForChildSignal for each change, and nothing else sends
// one here (no child of this test ends).
TEST_F(RunFollowerTest, EachChangeWakesAThreadWaitingForChildSignal) {
  while (WaitForChildSignal(absl::ZeroDuration())) {
  }
  v1::SubmitRunResponse run = Submit("follow-wake", 1);
  RunFollower follower(coord_.Client(run.run_token()), run.run_id(), [] { ::kill(::getpid(), SIGCHLD); });
  follower.Start();
  auto wait_for_state = [&](v1::RunState state) {
    for (int wakeups = 0; wakeups < 20; ++wakeups) {
      if (!WaitForChildSignal(absl::Seconds(20))) return false;
      std::optional<v1::Run> r = follower.Take();
      if (r && r->state() == state) return true;
    }
    return false;
  };
  ASSERT_TRUE(wait_for_state(v1::PENDING));
  auto agents = testing::RegisterAgents(coord_.Client(run.run_token()), run.run_id(), "n1", 1);
  ASSERT_TRUE(wait_for_state(v1::RUNNING));
  ASSERT_TRUE(agents[0]->Leave(0).ok());
  ASSERT_TRUE(wait_for_state(v1::SUCCEEDED));
  // (The stream's end calls the callback too: see the refused token's test. Here its signal may
  // coalesce with the last snapshot's.)
}

TEST_F(RunFollowerTest, EveryStateChangeArrivesWithAWakeupAndTheStreamEndsWithTheRun) {
  v1::SubmitRunResponse run = Submit("follow", 2);
  std::atomic<int> wakeups{0};
  RunFollower follower(coord_.Client(run.run_token()), run.run_id(), [&] { ++wakeups; });
  follower.Start();
  std::vector<v1::Run> seen;
  ASSERT_TRUE(WaitForSnapshot(
      follower, [](const v1::Run& r) { return r.state() == v1::PENDING; }, seen));
  EXPECT_TRUE(follower.Streaming());

  // Nothing is asked for after the first snapshot: the changes come to the follower.
  auto agents = testing::RegisterAgents(coord_.Client(run.run_token()), run.run_id(), "n1", 2);
  ASSERT_TRUE(WaitForSnapshot(
      follower, [](const v1::Run& r) { return r.state() == v1::RUNNING; }, seen));
  EXPECT_EQ(seen.back().world_size(), 2);
  for (auto& a : agents) ASSERT_TRUE(a->Leave(0).ok());
  ASSERT_TRUE(WaitForSnapshot(
      follower, [](const v1::Run& r) { return r.state() == v1::SUCCEEDED; }, seen));

  // The coordinator ends the stream after the terminal snapshot: the follower stops there.
  ASSERT_TRUE(testing::WaitFor([&] { return !follower.Streaming(); }, absl::Seconds(10)));
  EXPECT_TRUE(follower.LastEnd().ok()) << follower.LastEnd();
  EXPECT_TRUE(follower.Ended());
  // Each snapshot stored woke the loop; several may have been taken as one.
  EXPECT_GE(wakeups.load(), static_cast<int>(seen.size()));
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i].revision(), seen[i - 1].revision());
}

TEST_F(RunFollowerTest, TheStreamIsOpenedAgainAfterTheCoordinatorIsKilled) {
  v1::SubmitRunResponse run = Submit("follow-restart", 1);
  RunFollower follower(coord_.Client(run.run_token()), run.run_id(), [] {});
  follower.Start(absl::Milliseconds(100));
  std::vector<v1::Run> seen;
  ASSERT_TRUE(WaitForSnapshot(
      follower, [](const v1::Run& r) { return r.state() == v1::PENDING; }, seen));

  coord_.KillAndRestart();
  // The restarted coordinator's first snapshot arrives on a new stream; the old one ended
  // UNAVAILABLE (revisions start again with the coordinator, so only the state is compared).
  ASSERT_TRUE(WaitForSnapshot(
      follower, [](const v1::Run& r) { return r.state() == v1::PENDING; }, seen));
  EXPECT_EQ(follower.LastEnd().code(), absl::StatusCode::kUnavailable) << follower.LastEnd();
  EXPECT_TRUE(follower.Streaming());
  EXPECT_FALSE(follower.Ended());

  // And the new stream carries the changes made after the restart.
  v1::CancelRunRequest cancel;
  cancel.set_run_id(run.run_id());
  cancel.set_reason("the test is done");
  auto admin = coord_.AdminClient();
  ASSERT_TRUE(Call(*admin, &v1::RunService::Stub::CancelRun, admin->runs(), cancel, absl::Seconds(10)).ok());
  ASSERT_TRUE(WaitForSnapshot(
      follower, [](const v1::Run& r) { return r.state() == v1::CANCELLED; }, seen));
}

TEST_F(RunFollowerTest, AnotherRunsTokenIsRefusedOnceAndNothingIsDelivered) {
  v1::SubmitRunResponse mine = Submit("follow-mine", 1);
  v1::SubmitRunResponse other = Submit("follow-other", 1);
  std::atomic<int> ends{0};
  RunFollower follower(coord_.Client(other.run_token()), mine.run_id(), [&] { ++ends; });
  follower.Start(absl::Milliseconds(10));
  // Asking again cannot change a refusal: the follower stops after the first, saying why.
  ASSERT_TRUE(testing::WaitFor([&] { return follower.Ended(); }, absl::Seconds(10)));
  EXPECT_EQ(follower.LastEnd().code(), absl::StatusCode::kPermissionDenied) << follower.LastEnd();
  EXPECT_FALSE(follower.Streaming());
  EXPECT_FALSE(follower.Take().has_value());
  EXPECT_EQ(ends.load(), 1);
}

}  // namespace
}  // namespace dt

// SIGCHLD is blocked before gtest or gRPC start a thread, so every thread inherits the block and
// the follower's signal waits for WaitForChildSignal, as in the launcher (RunLocalLauncher).
int main(int argc, char** argv) {
  dt::BlockChildSignal();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
