// What every part says about a run's state and failures, in one wording: dtcoord's log and
// messages, dtctl's status and watch, the W&B forwarder and the Prometheus exporter.
#pragma once

#include <string>

#include "dt/v1/common.pb.h"
#include "dt/v1/runs.pb.h"

namespace dt {

// nodes × processes per node (the spec is validated: the product fits, at most 131,072).
int WorldSize(const v1::RunSpec& spec);
// The most ranks any generation of the run had (an elastic run's shrunk generation has fewer than
// its spec; their logs stay): the ranks whose logs there may be.
int MostRanks(const v1::Run& run);

// "RUNNING", "SUCCEEDED", …: the enum's own name, as logs, dtctl and the console show it.
std::string StateName(v1::RunState state);

// SUCCEEDED, FAILED or CANCELLED: the run does nothing more.
bool IsTerminal(v1::RunState state);

// One line: "rank 1 (node n2, host h2) failed at step 40: ValueError: …", "rank 0 (…) exited:
// killed by signal 9", "… sent no heartbeat for 30s …"; fatal failures say they were not retried.
// The text is the run's own (it may quote a trainer's message): escape it before a terminal.
std::string DescribeFailure(const v1::Failure& failure);

}  // namespace dt
