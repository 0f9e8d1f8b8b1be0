// Elastic runs (RunSpec.min_nodes): which nodes a failed generation lost, and which nodes the next
// generation forms on. Pure functions over what the coordinator knows of the failed generation, so
// the rules are tested without a coordinator.
//
// A node is lost when every one of its ranks went silent: one silent rank of a node whose other
// ranks still heartbeat is a failed process, not a lost node, and restarts the run at full size.
// A generation shrinks only when a node was lost and at least min_nodes remain; any other restart
// forms at the run's full size again, which is how a node that comes back rejoins.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace dt {

// One rank of the failed generation, in rank order.
struct RankSilence {
  std::string node;
  absl::Duration silent;  // since its last heartbeat
  bool finished = false;  // left with success: not silent, whatever its last heartbeat
};

// The nodes all of whose ranks have been silent for at least `threshold`, in the order their first
// rank appears. A finished rank keeps its node from counting as lost.
std::vector<std::string> LostNodes(const std::vector<RankSilence>& ranks, absl::Duration threshold);

// The next generation's shape.
struct NextNodes {
  std::vector<std::string> nodes;  // the nodes to form on, in node order; empty: the run's full size
  std::vector<std::string> lost;   // the lost nodes it leaves out (empty when full size)
};

// After a generation on `generation_nodes` (every node of it, in node order) lost `lost`: the nodes
// that remain when there are at least `min_nodes` of them and at least one was lost; otherwise the
// full size (the run waits for every node, as a fixed-size run does).
NextNodes NextGenerationNodes(const std::vector<std::string>& generation_nodes, const std::vector<std::string>& lost,
                              int min_nodes);

}  // namespace dt
