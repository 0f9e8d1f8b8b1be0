// Rank assignment: node-contiguous, natural node order, local slot order.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "coordinator/rank_assignment.h"

namespace dt {
namespace {

TEST(NaturalLess, NumbersCompareAsNumbers) {
  EXPECT_TRUE(NaturalLess("n2", "n10"));
  EXPECT_FALSE(NaturalLess("n10", "n2"));
  EXPECT_TRUE(NaturalLess("gpu-a", "gpu-b"));
  EXPECT_TRUE(NaturalLess("n1", "n1a"));
  EXPECT_FALSE(NaturalLess("n1", "n1"));
  EXPECT_TRUE(NaturalLess("node9-x", "node10-a"));
}

TEST(AssignRanks, NodeContiguousInNaturalOrderWhateverTheArrivalOrder) {
  std::vector<SlotClaim> claims;
  for (const char* node : {"n10", "n2", "n1"}) {
    for (int slot = 0; slot < 4; ++slot) claims.push_back({node, slot});
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(claims.begin(), claims.end(), rng);
    std::vector<Assignment> a = AssignRanks(claims);
    std::vector<int> seen(12, 0);
    for (size_t i = 0; i < claims.size(); ++i) {
      int node_index = claims[i].node == "n1" ? 0 : claims[i].node == "n2" ? 1 : 2;
      EXPECT_EQ(a[i].node_rank, node_index);
      EXPECT_EQ(a[i].rank, node_index * 4 + claims[i].local_slot);
      EXPECT_EQ(a[i].local_rank, claims[i].local_slot);
      EXPECT_EQ(a[i].local_world_size, 4);
      EXPECT_EQ(a[i].nodes, 3);
      ++seen[a[i].rank];
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 12);  // a permutation
  }
}

TEST(AssignRanks, LocalRankIsPositionWithinNode) {
  // Slots need not start at 0 (a launcher that numbers from 1): local ranks still do.
  std::vector<Assignment> a = AssignRanks({{"a", 3}, {"a", 1}});
  EXPECT_EQ(a[0].local_rank, 1);
  EXPECT_EQ(a[1].local_rank, 0);
  EXPECT_EQ(a[1].rank, 0);
}

}  // namespace
}  // namespace dt
