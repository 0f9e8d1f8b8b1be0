// The barrier state machine: release, timeouts fixed by the first arrival, missing ranks named,
// reuse of names, retries, abort.
#include <gtest/gtest.h>

#include "common/limits.h"
#include "coordinator/barrier_table.h"

namespace dt {
namespace {

class BarrierTableTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  TimerQueue timers_{&clock_};
  BarrierTable table_{"run r-x generation 0",
                      3,
                      &clock_,
                      &timers_,
                      [](int r) { return "rank " + std::to_string(r) + " (node n" + std::to_string(r) + ")"; },
                      [this](absl::Time when, const std::string& name, uint64_t seq) {
                        return timers_.Schedule(when, [this, name, seq] {
                          Deferred d;
                          table_.Expire(name, seq, d);
                        });
                      }};
  std::vector<std::optional<absl::StatusOr<BarrierRelease>>> results_ =
      std::vector<std::optional<absl::StatusOr<BarrierRelease>>>(3);

  void Arrive(int rank, const std::string& name, absl::Duration timeout, uint64_t seq = 0) {
    Deferred d;
    table_.Arrive(rank, name, seq, timeout,
                  MakePending<BarrierRelease>([this, rank](absl::StatusOr<BarrierRelease> r) { results_[rank] = r; }),
                  d);
  }
  void Advance(absl::Duration by) {
    clock_.Advance(by);
    timers_.RunDue();
  }
};

TEST_F(BarrierTableTest, ReleasesWhenEveryRankArrived) {
  Arrive(0, "data", absl::Seconds(10));
  Advance(absl::Seconds(1));
  Arrive(2, "data", absl::Seconds(10));
  EXPECT_FALSE(results_[0].has_value());
  Arrive(1, "data", absl::Seconds(10));
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(results_[r].has_value()) << r;
    ASSERT_TRUE(results_[r]->ok());
    EXPECT_EQ((*results_[r])->sequence, 1u);
  }
  EXPECT_EQ((*results_[0])->waited, absl::Seconds(1));
}

TEST_F(BarrierTableTest, TimeoutIsFixedByTheFirstArrivalAndNamesTheMissing) {
  Arrive(0, "ckpt", absl::Seconds(5));
  Advance(absl::Seconds(4));
  Arrive(1, "ckpt", absl::Seconds(100));  // a later, longer timeout does not extend it
  Advance(absl::Seconds(1));
  for (int r : {0, 1}) {
    ASSERT_TRUE(results_[r].has_value());
    EXPECT_EQ(results_[r]->status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_NE(results_[r]->status().message().find("missing 1: rank 2 (node n2)"), std::string::npos)
        << results_[r]->status().message();
    EXPECT_NE(results_[r]->status().message().find("2 of 3 ranks arrived"), std::string::npos);
  }
}

TEST_F(BarrierTableTest, NamesAreReusableInstanceByInstance) {
  for (int round = 1; round <= 3; ++round) {
    results_.assign(3, std::nullopt);
    for (int r = 0; r < 3; ++r) Arrive(r, "step", absl::Seconds(10));
    for (int r = 0; r < 3; ++r) EXPECT_EQ((*results_[r])->sequence, static_cast<uint64_t>(round));
  }
}

TEST_F(BarrierTableTest, RetryOfAReleasedInstanceAnswersAtOnce) {
  for (int r = 0; r < 3; ++r) Arrive(r, "x", absl::Seconds(10), 1);
  results_.assign(3, std::nullopt);
  Arrive(1, "x", absl::Seconds(10), 1);  // its first reply was lost
  ASSERT_TRUE(results_[1].has_value());
  EXPECT_TRUE(results_[1]->ok());
  Arrive(1, "x", absl::Seconds(10), 5);
  EXPECT_EQ(results_[1]->status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BarrierTableTest, AbortFailsOpenBarriersAtOnceAndLaterArrivals) {
  Arrive(0, "a", absl::Seconds(100));
  Arrive(1, "b", absl::Seconds(100));
  {
    Deferred d;
    table_.Abort(absl::AbortedError("rank 2 (node n2) sent no heartbeat for 30s"), d);
  }
  for (int r : {0, 1}) {
    ASSERT_TRUE(results_[r].has_value());
    EXPECT_EQ(results_[r]->status().code(), absl::StatusCode::kAborted);
    EXPECT_NE(results_[r]->status().message().find("rank 2"), std::string::npos);
  }
  Arrive(2, "a", absl::Seconds(1));
  EXPECT_EQ(results_[2]->status().code(), absl::StatusCode::kAborted);
}

// Every name keeps its count for the generation's life, so the names are bounded: past the limit
// a new name is refused, naming the limit and what to do; a name already in use still works.
TEST_F(BarrierTableTest, ANewNamePastTheLimitIsRefusedAndOldNamesStillWork) {
  for (size_t n = 0; n < kMaxBarrierNames; ++n) {
    Arrive(0, "step-" + std::to_string(n), absl::Hours(1));
    ASSERT_FALSE(results_[0].has_value()) << n;
  }
  Arrive(0, "one-too-many", absl::Hours(1));
  ASSERT_TRUE(results_[0].has_value());
  EXPECT_EQ(results_[0]->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(results_[0]->status().message().find("16384 barrier names"), std::string::npos) << results_[0]->status();
  EXPECT_NE(results_[0]->status().message().find("reuse a name"), std::string::npos);
  for (int r = 0; r < 3; ++r) Arrive(r, "step-7", absl::Hours(1));
  ASSERT_TRUE(results_[1].has_value() && results_[1]->ok()) << results_[1]->status();
}

TEST_F(BarrierTableTest, RefusesBadInput) {
  Arrive(0, "", absl::Seconds(1));
  EXPECT_EQ(results_[0]->status().code(), absl::StatusCode::kInvalidArgument);
  Deferred d;
  std::optional<absl::StatusOr<BarrierRelease>> out;
  table_.Arrive(7, "x", 0, absl::Seconds(1),
                MakePending<BarrierRelease>([&](absl::StatusOr<BarrierRelease> r) { out = r; }), d);
  d.RunNow();
  EXPECT_NE(out->status().message().find("outside 0..2"), std::string::npos);
}

}  // namespace
}  // namespace dt
