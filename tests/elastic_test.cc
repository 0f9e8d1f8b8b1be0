// Elastic runs' rules: a node is lost when all its ranks went silent, and a generation shrinks to the
// nodes that remain only while at least min_nodes do.
#include "coordinator/elastic.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dt {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kThreshold = absl::Seconds(5);

TEST(LostNodesTest, NodeWhoseRanksAllWentSilentIsLost) {
  std::vector<RankSilence> ranks = {{"n1", absl::Seconds(1)}, {"n1", absl::Seconds(0)}, {"n2", absl::Seconds(9)},
                                    {"n2", absl::Seconds(6)}, {"n3", absl::Seconds(1)}, {"n3", absl::Seconds(2)}};
  EXPECT_THAT(LostNodes(ranks, kThreshold), ElementsAre("n2"));
}

TEST(LostNodesTest, OneSilentRankOfANodeIsAFailedProcessNotALostNode) {
  std::vector<RankSilence> ranks = {{"n1", absl::Seconds(1)}, {"n2", absl::Seconds(9)}, {"n2", absl::Seconds(1)}};
  EXPECT_THAT(LostNodes(ranks, kThreshold), IsEmpty());
}

TEST(LostNodesTest, FinishedRankKeepsItsNodeFromCountingAsLost) {
  std::vector<RankSilence> ranks = {
      {"n1", absl::Seconds(9), /*finished=*/true}, {"n1", absl::Seconds(9)}, {"n2", absl::Seconds(9)}};
  EXPECT_THAT(LostNodes(ranks, kThreshold), ElementsAre("n2"));
}

TEST(LostNodesTest, SeveralLostNodesInRankOrder) {
  std::vector<RankSilence> ranks = {{"b", absl::Seconds(7)}, {"a", absl::Seconds(1)}, {"c", absl::Seconds(5)}};
  EXPECT_THAT(LostNodes(ranks, kThreshold), ElementsAre("b", "c"));
}

TEST(NextGenerationNodesTest, ShrinksToTheNodesThatRemain) {
  NextNodes next = NextGenerationNodes({"n1", "n2", "n3"}, {"n2"}, 2);
  EXPECT_THAT(next.nodes, ElementsAre("n1", "n3"));
  EXPECT_THAT(next.lost, ElementsAre("n2"));
}

TEST(NextGenerationNodesTest, FullSizeWhenFewerThanMinNodesRemain) {
  NextNodes next = NextGenerationNodes({"n1", "n2", "n3"}, {"n2", "n3"}, 2);
  EXPECT_THAT(next.nodes, IsEmpty());
  EXPECT_THAT(next.lost, IsEmpty());
}

TEST(NextGenerationNodesTest, FullSizeWhenNoNodeWasLost) {
  EXPECT_THAT(NextGenerationNodes({"n1", "n2"}, {}, 1).nodes, IsEmpty());
}

TEST(NextGenerationNodesTest, FixedRunNeverShrinks) {
  EXPECT_THAT(NextGenerationNodes({"n1", "n2", "n3"}, {"n3"}, 0).nodes, IsEmpty());
}

TEST(NextGenerationNodesTest, LostNodeOutsideTheGenerationIsIgnored) {
  NextNodes next = NextGenerationNodes({"n1", "n2"}, {"n9"}, 1);
  EXPECT_THAT(next.nodes, IsEmpty());
}

TEST(NextGenerationNodesTest, ShrinksAgainFromAShrunkGeneration) {
  NextNodes next = NextGenerationNodes({"n1", "n3"}, {"n3"}, 1);
  EXPECT_THAT(next.nodes, ElementsAre("n1"));
  EXPECT_THAT(next.lost, ElementsAre("n3"));
}

}  // namespace
}  // namespace dt
