#include "coordinator/elastic.h"

#include <map>

#include "absl/algorithm/container.h"

namespace dt {

std::vector<std::string> LostNodes(const std::vector<RankSilence>& ranks, absl::Duration threshold) {
  std::vector<std::string> order;
  std::map<std::string, bool> all_silent;
  for (const RankSilence& r : ranks) {
    auto [it, added] = all_silent.emplace(r.node, true);
    if (added) order.push_back(r.node);
    if (r.finished || r.silent < threshold) it->second = false;
  }
  std::vector<std::string> lost;
  for (const std::string& node : order) {
    if (all_silent[node]) lost.push_back(node);
  }
  return lost;
}

NextNodes NextGenerationNodes(const std::vector<std::string>& generation_nodes, const std::vector<std::string>& lost,
                              int min_nodes) {
  NextNodes next;
  if (min_nodes <= 0) return next;
  for (const std::string& node : generation_nodes) {
    if (absl::c_linear_search(lost, node)) {
      next.lost.push_back(node);
    } else {
      next.nodes.push_back(node);
    }
  }
  if (next.lost.empty() || next.nodes.empty() || static_cast<int>(next.nodes.size()) < min_nodes) return NextNodes{};
  return next;
}

}  // namespace dt
