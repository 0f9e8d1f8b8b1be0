// Rank assignment: ranks on one node are contiguous and ordered by local slot; nodes are ordered
// by natural name order ("n2" < "n10"), which also gives node_rank. Deterministic, so a restarted
// group on the same nodes gets the same ranks.
#pragma once

#include <string>
#include <vector>
#include "absl/strings/string_view.h"

namespace dt {

struct SlotClaim {
  std::string node;
  int local_slot = 0;
};

struct Assignment {
  int rank = 0;
  int local_rank = 0;
  int local_world_size = 0;
  int node_rank = 0;
  int nodes = 0;
};

// Natural order: runs of digits compare as numbers, the rest byte-wise.
bool NaturalLess(absl::string_view a, absl::string_view b);

// One assignment per claim, in the claims' order. Claims must be distinct (node, slot) pairs.
std::vector<Assignment> AssignRanks(const std::vector<SlotClaim>& claims);

}  // namespace dt
