// Failures that a restart cannot mend, told from the failures before them. A generation that hangs
// with the odd stack of the generations just before it, or fails before its first step with the
// exception that ended the generation before, will do so again: the run ends instead of restarting.
// Pure functions over the run's failure record, so the rules are tested without a coordinator.
#pragma once

#include <vector>

#include "dt/v1/common.pb.h"

namespace dt {

// `failure` is a HANG of generation G. When the `allowed` generations before G (--max-identical-hangs)
// each ended by a hang with the same odd stack (verdict.odd_signature), `failure` becomes
// HUNG_REPEATEDLY and fatal, naming those generations. `earlier` is the run's failure record, oldest
// first; each generation is judged by its newest failure there. A hang without an odd stack is never
// called repeated. `allowed` is at least 1 (ValidateRunSpec refuses 0).
void MarkRepeatedHang(const std::vector<v1::Failure>& earlier, int allowed, v1::Failure& failure);

// `failure` (REPORTED_ERROR or PROCESS_EXITED, its before_first_step set by the caller) becomes fatal
// when generation G-1's newest failure ended it before its first step, on any rank, with the same
// exception type and the same message but for its digits (pids, ports, times and rank numbers
// differ each try; which of several ranks failing alike is reported first is a race).
void MarkRepeatedEarlyFailure(const std::vector<v1::Failure>& earlier, v1::Failure& failure);

}  // namespace dt
