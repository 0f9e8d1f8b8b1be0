// Verdicts on the device pre-flights of one generation's ranks. Each rank times a square matrix
// multiply on its device (and one all-reduce) before its first step. In data-parallel training
// every step waits for the slowest rank, so one degraded device (a throttling GPU, a node shared
// with a runaway process, a failing card) paces the whole job: such a rank is named before it
// costs hours, and on Slurm its node is left out. Pure logic: the coordinator calls it under the
// run's lock.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dt/v1/common.pb.h"

namespace dt {

struct PreflightPolicy {
  // A multiply that takes more than this many times the group's median marks the rank slow. No
  // absolute floor: each figure is a median over samples of 10 ms or more (RunDevicePreflight), so
  // a fast device's figure carries no timer noise, and a node 4x slower is slow at any speed.
  double slowdown_limit = 3.0;
};

struct UnhealthyRank {
  int rank = -1;
  std::string why;  // e.g. "its matrix multiply took 61.2 ms, 6.8x the median of 2 ranks (9.0 ms)"
};

// The ranks to blame, worst first: every rank whose device reported an error, then (only with
// `judge_speed` and once every rank reported) every rank slower than the policy allows. Empty
// when the group is healthy or reports are still missing. `reports[r]` is rank r's, if it came.
std::vector<UnhealthyRank> JudgePreflights(const std::vector<std::optional<v1::DevicePreflight>>& reports,
                                           const PreflightPolicy& policy, bool judge_speed);

}  // namespace dt
