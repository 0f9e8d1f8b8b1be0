// Which ranks a generation's device pre-flights make unhealthy.
#include "coordinator/preflight_judge.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dt {
namespace {

using Reports = std::vector<std::optional<v1::DevicePreflight>>;

v1::DevicePreflight Timed(double ms) {
  v1::DevicePreflight p;
  p.set_device("cpu (1 thread(s))");
  p.set_matmul_size(512);
  p.set_matmul_seconds(ms / 1e3);
  return p;
}

v1::DevicePreflight Failed(const std::string& error) {
  v1::DevicePreflight p;
  p.set_device("cuda:1");
  p.set_error(error);
  return p;
}

std::vector<int> Ranks(const std::vector<UnhealthyRank>& bad) {
  std::vector<int> out;
  for (const auto& b : bad) out.push_back(b.rank);
  return out;
}

TEST(PreflightJudge, AHealthyGroupHasNoneToBlame) {
  PreflightPolicy policy;
  EXPECT_TRUE(JudgePreflights({Timed(9), Timed(10), Timed(11), Timed(25)}, policy, true).empty());
  EXPECT_TRUE(JudgePreflights({Timed(9)}, policy, true).empty());
}

TEST(PreflightJudge, ARankFarSlowerThanTheMedianIsNamedWithItsNumbers) {
  PreflightPolicy policy;
  std::vector<UnhealthyRank> bad = JudgePreflights({Timed(9), Timed(61.2), Timed(10), Timed(9.5)}, policy, true);
  ASSERT_THAT(Ranks(bad), ::testing::ElementsAre(1));
  EXPECT_THAT(bad[0].why, ::testing::HasSubstr("took 61.2 ms, 6.4x the median of the run's 4 ranks (9.5 ms"));
  EXPECT_THAT(bad[0].why, ::testing::HasSubstr("order 512 on cpu (1 thread(s))"));
  EXPECT_THAT(bad[0].why, ::testing::HasSubstr("the limit is 3x"));
}

TEST(PreflightJudge, WithTwoRanksTheFasterIsTheReference) {
  PreflightPolicy policy;
  EXPECT_THAT(Ranks(JudgePreflights({Timed(50), Timed(10)}, policy, true)), ::testing::ElementsAre(0));
  EXPECT_TRUE(JudgePreflights({Timed(25), Timed(10)}, policy, true).empty());
}

TEST(PreflightJudge, SeveralSlowRanksComeWorstFirst) {
  PreflightPolicy policy;
  EXPECT_THAT(Ranks(JudgePreflights({Timed(10), Timed(40), Timed(10), Timed(90), Timed(11)}, policy, true)),
              ::testing::ElementsAre(3, 1));
}

TEST(PreflightJudge, ASlowdownCountsHoweverFastTheDevice) {
  // A node beside busy neighbours: 1.5 ms against 6 ms on one CPU core (the figures of a run whose
  // slow node went unnamed while a 5 ms floor on the excess stood).
  PreflightPolicy policy;
  EXPECT_THAT(Ranks(JudgePreflights({Timed(1.48), Timed(5.96)}, policy, true)), ::testing::ElementsAre(1));
  EXPECT_THAT(Ranks(JudgePreflights({Timed(0.2), Timed(0.8), Timed(0.21)}, policy, true)), ::testing::ElementsAre(1));
  EXPECT_TRUE(JudgePreflights({Timed(0.2), Timed(0.58), Timed(0.21)}, policy, true).empty());
}

TEST(PreflightJudge, SpeedIsJudgedOnlyWhenAskedAndOnceEveryRankReported) {
  PreflightPolicy policy;
  EXPECT_TRUE(JudgePreflights({Timed(10), Timed(100)}, policy, /*judge_speed=*/false).empty());
  EXPECT_TRUE(JudgePreflights({Timed(10), Timed(100), std::nullopt}, policy, true).empty());
}

TEST(PreflightJudge, ADeviceErrorIsNamedAtOnceWhateverElse) {
  PreflightPolicy policy;
  std::vector<UnhealthyRank> bad =
      JudgePreflights({Timed(10), Failed("CUDA error: an illegal memory access was encountered"), std::nullopt}, policy,
                      /*judge_speed=*/false);
  ASSERT_THAT(Ranks(bad), ::testing::ElementsAre(1));
  EXPECT_EQ(bad[0].why, "its device (cuda:1) reported an error: CUDA error: an illegal memory access was encountered");
}

}  // namespace
}  // namespace dt
