#include "coordinator/preflight_judge.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace dt {
namespace {

std::string Millis(double seconds) { return absl::StrFormat("%.1f ms", seconds * 1e3); }

}  // namespace

std::vector<UnhealthyRank> JudgePreflights(const std::vector<std::optional<v1::DevicePreflight>>& reports,
                                           const PreflightPolicy& policy, bool judge_speed) {
  std::vector<UnhealthyRank> out;
  bool complete = true;
  for (size_t r = 0; r < reports.size(); ++r) {
    if (!reports[r]) {
      complete = false;
    } else if (!reports[r]->error().empty()) {
      out.push_back({static_cast<int>(r), absl::StrFormat("its device (%s) reported an error: %s", reports[r]->device(),
                                                          reports[r]->error())});
    }
  }
  if (!judge_speed || !complete || reports.size() < 2 || !out.empty()) return out;
  std::vector<double> times;
  for (const auto& report : reports) times.push_back(report->matmul_seconds());
  // The lower median: with two ranks, the faster one is the reference.
  std::vector<double> sorted = times;
  std::nth_element(sorted.begin(), sorted.begin() + (sorted.size() - 1) / 2, sorted.end());
  double median = sorted[(sorted.size() - 1) / 2];
  std::vector<std::pair<double, int>> slow;
  for (size_t r = 0; r < times.size(); ++r) {
    if (times[r] > policy.slowdown_limit * median) {
      slow.emplace_back(times[r], static_cast<int>(r));
    }
  }
  std::sort(slow.begin(), slow.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [seconds, rank] : slow) {
    out.push_back({rank, absl::StrFormat("its matrix multiply (order %d on %s) took %s, %.1fx the median of the "
                                         "run's %d ranks (%s; the limit is %gx)",
                                         reports[rank]->matmul_size(), reports[rank]->device(), Millis(seconds),
                                         median > 0 ? seconds / median : 0.0, static_cast<int>(times.size()),
                                         Millis(median), policy.slowdown_limit)});
  }
  return out;
}

}  // namespace dt
