// The dtctl commands that read or change one run (or list them): list, status, logs, metrics,
// checkpoints, stacks, cancel. `watch` is in watch.h. Each returns dtctl's exit code.
#pragma once

#include <optional>
#include <string>

#include "client/dtctl/command.h"
#include "client/dtctl/logs.h"
#include "client/dtctl/stacks.h"

namespace dt::ctl {

int List(Global& g);
int Status(Global& g, const std::string& run_id);
int Logs(Global& g, const std::string& run_id, std::optional<int> rank, LogsQuery query);
int Metrics(Global& g, const std::string& run_id, const std::string& key, std::optional<int> rank);
int Checkpoints(Global& g, const std::string& run_id, bool verify);
int Stacks(Global& g, const StacksQuery& q);
int Cancel(Global& g, const std::string& run_id);

}  // namespace dt::ctl
