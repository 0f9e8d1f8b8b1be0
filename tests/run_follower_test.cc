// The launcher's RunFollower against the dtcoord binary: every change of a run arrives through
// one WatchRun stream (with a wakeup for the launcher's loop), the stream is opened again after a
// kill -9 of the coordinator, and a token of another run is refused without any snapshot.
#include "client/dtctl/run_follower.h"

#include <gtest/gtest.h>

#include <atomic>

#include "client/agent.h"
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

  // And the new stream carries the changes made after the restart.
  v1::CancelRunRequest cancel;
  cancel.set_run_id(run.run_id());
  cancel.set_reason("the test is done");
  auto admin = coord_.AdminClient();
  ASSERT_TRUE(Call(*admin, &v1::RunService::Stub::CancelRun, admin->runs(), cancel, absl::Seconds(10)).ok());
  ASSERT_TRUE(WaitForSnapshot(
      follower, [](const v1::Run& r) { return r.state() == v1::CANCELLED; }, seen));
}

TEST_F(RunFollowerTest, AnotherRunsTokenIsRefusedAndNothingIsDelivered) {
  v1::SubmitRunResponse mine = Submit("follow-mine", 1);
  v1::SubmitRunResponse other = Submit("follow-other", 1);
  RunFollower follower(coord_.Client(other.run_token()), mine.run_id(), [] {});
  follower.Start(absl::Milliseconds(50));
  ASSERT_TRUE(testing::WaitFor([&] { return !follower.LastEnd().ok(); }, absl::Seconds(10)));
  EXPECT_EQ(follower.LastEnd().code(), absl::StatusCode::kPermissionDenied) << follower.LastEnd();
  EXPECT_FALSE(follower.Streaming());
  EXPECT_FALSE(follower.Take().has_value());
  // The destructor ends the retries (the test would time out otherwise).
}

}  // namespace
}  // namespace dt
