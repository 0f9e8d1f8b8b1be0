#include "coordinator/rank_assignment.h"

#include <algorithm>
#include <numeric>

namespace dt {

bool NaturalLess(absl::string_view a, absl::string_view b) {
  size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      size_t i0 = i, j0 = j;
      while (i0 < a.size() && a[i0] == '0') ++i0;  // leading zeros do not change the number
      while (j0 < b.size() && b[j0] == '0') ++j0;
      size_t i1 = i0, j1 = j0;
      while (i1 < a.size() && digit(a[i1])) ++i1;
      while (j1 < b.size() && digit(b[j1])) ++j1;
      absl::string_view na = a.substr(i0, i1 - i0), nb = b.substr(j0, j1 - j0);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      if ((i1 - i) != (j1 - j)) return (i1 - i) < (j1 - j);  // "01" after "1"
      i = i1;
      j = j1;
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i;
    ++j;
  }
  return (a.size() - i) < (b.size() - j);
}

std::vector<Assignment> AssignRanks(const std::vector<SlotClaim>& claims) {
  std::vector<size_t> order(claims.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const SlotClaim& a = claims[x];
    const SlotClaim& b = claims[y];
    if (a.node != b.node) return NaturalLess(a.node, b.node);
    return a.local_slot < b.local_slot;
  });
  // Nodes in order, with how many claims each has.
  std::vector<std::pair<std::string, int>> nodes;
  for (size_t idx : order) {
    if (nodes.empty() || nodes.back().first != claims[idx].node) nodes.emplace_back(claims[idx].node, 0);
    ++nodes.back().second;
  }
  std::vector<Assignment> out(claims.size());
  int rank = 0;
  size_t node_index = 0;
  int local = 0;
  for (size_t idx : order) {
    if (claims[idx].node != nodes[node_index].first) {
      ++node_index;
      local = 0;
    }
    Assignment& a = out[idx];
    a.rank = rank++;
    a.local_rank = local++;
    a.local_world_size = nodes[node_index].second;
    a.node_rank = static_cast<int>(node_index);
    a.nodes = static_cast<int>(nodes.size());
  }
  return out;
}

}  // namespace dt
